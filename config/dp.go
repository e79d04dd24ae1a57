package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
)

// Data-parallel endpoints (data_parallel_size > 1): one URL in front of N
// vLLM engine cores. The config keeps the endpoint as written; KVEndpoints
// expands it into its ranks, and DataParallelAddress gives each rank's
// KV-event addresses.

// MaxDataParallelSize bounds data_parallel_size.
const MaxDataParallelSize = 1024

// DataParallelAddress returns the ZMQ address of data-parallel rank rank's
// KV-event socket, given rank 0's, as vLLM's publisher derives it
// (ZmqEventPublisher.offset_endpoint_port in vllm/distributed/kv_events.py):
// rank 0 uses addr itself, a tcp:// address's port is increased by rank, an
// inproc:// name gets the suffix _dp<rank>. vLLM refuses any other address
// (ipc://) for a rank above 0, and so does DataParallelAddress.
func DataParallelAddress(addr string, rank int) (string, error) {
	if addr == "" || rank == 0 {
		return addr, nil
	}
	switch {
	case strings.HasPrefix(addr, "inproc://"):
		return addr + "_dp" + strconv.Itoa(rank), nil
	case strings.HasPrefix(addr, "tcp://"):
		host, port, ok := tcpPort(addr)
		if !ok || port < 0 {
			return "", fmt.Errorf("%q has no port to offset by the data-parallel rank", addr)
		}
		if port+rank > 65535 {
			return "", fmt.Errorf("%q: port %d + rank %d is above 65535", addr, port, rank)
		}
		return "tcp://" + host + ":" + strconv.Itoa(port+rank), nil
	}
	return "", errors.New("vLLM offsets only tcp:// ports (and inproc:// names) by data-parallel rank: use a tcp:// address")
}

// validateDataParallel checks endpoint i's data_parallel_size and what it
// requires of the endpoint's other fields.
func (m *Model) validateDataParallel(v *validator, p string, i int) {
	e := &m.Endpoints[i]
	path := fmt.Sprintf("%s.endpoints[%d].data_parallel_size", p, i)
	n := e.DataParallelSize
	switch {
	case n < 1:
		v.addf(path, "%d is not positive", n)
		return
	case n > MaxDataParallelSize:
		v.addf(path, "%d is above %d", n, MaxDataParallelSize)
		return
	case n == 1:
		if e.DataParallelStartRank != 0 {
			v.addf(fmt.Sprintf("%s.endpoints[%d].data_parallel_start_rank", p, i),
				"%d needs data_parallel_size above 1 (one rank served alone is a plain endpoint; give its own kv_events port)", e.DataParallelStartRank)
		}
		return
	}
	last := e.DataParallelStartRank + n - 1 // the last rank behind the URL
	switch sp := fmt.Sprintf("%s.endpoints[%d].data_parallel_start_rank", p, i); {
	case e.DataParallelStartRank < 0:
		v.addf(sp, "%d is negative", e.DataParallelStartRank)
		return
	case last > 65535:
		v.addf(sp, "%d: ranks above 65535", e.DataParallelStartRank)
		return
	}
	if r, err := kvroute.ParseRole(e.Role); err == nil && r.CanPrefill() && e.DataParallelStartRank != 0 &&
		m.Disaggregated() && m.PD.Protocol == "sglang" {
		// An SGLang decode engine finds the prefill's DP group as
		// bootstrap_room modulo the prefill server's DP size: the router
		// can pick the room for a rank only when the ranks behind the URL
		// are all the server's ranks.
		v.addf(fmt.Sprintf("%s.endpoints[%d].data_parallel_start_rank", p, i),
			"%d: with pd.protocol sglang a prefill endpoint must front all its server's ranks (start rank 0): "+
				"SGLang's decode engine finds the prefill rank from bootstrap_room modulo the server's data-parallel size", e.DataParallelStartRank)
	}
	m.checkRankMetrics(v, path, n, e.Signals)
	if h1, p1, ok1 := tcpPort(e.KVEvents.Address); ok1 {
		if h2, p2, ok2 := tcpPort(e.KVEvents.ReplayAddress); ok2 && h1 == h2 && p1-p2 < n && p2-p1 < n {
			// vLLM binds rank r's sockets at port + r: rank 1's events
			// would take rank 0's replay port (or the other way round).
			v.addf(fmt.Sprintf("%s.endpoints[%d].kv_events.replay_address", p, i),
				"port %d: with data_parallel_size %d the ranks' replay ports %d-%d overlap their event ports %d-%d (vLLM binds both at port + rank): put them at least %d apart",
				p2, n, p2+e.DataParallelStartRank, p2+last, p1+e.DataParallelStartRank, p1+last, n)
		}
	}
	for _, a := range []struct{ field, addr string }{{"address", e.KVEvents.Address}, {"replay_address", e.KVEvents.ReplayAddress}} {
		if a.addr == "" || !strings.Contains(a.addr, "://") { // no events, or reported already
			continue
		}
		if _, err := DataParallelAddress(a.addr, last); err != nil {
			v.addf(fmt.Sprintf("%s.endpoints[%d].kv_events.%s", p, i, a.field), "with data_parallel_size %d: %v", n, err)
		}
	}
}

// checkRankMetrics reports, at path (a data_parallel_size of n > 1), a
// scraped endpoint whose signals (es) are not vLLM's: only vLLM's metrics
// label each rank's series (engine="<rank>"), and the scrape of any other
// flavour fails for every rank.
func (m *Model) checkRankMetrics(v *validator, path string, n int, es EndpointSignals) {
	scraped := !m.Signals.Disabled && !es.Disabled
	if f := es.Flavor; scraped && f != "auto" && f != "vllm" && f != "vllm-legacy" {
		v.addf(path, "%d needs vLLM metrics, whose engine label tells the ranks apart; signals.flavor %q has no such label "+
			"(use auto, vllm or vllm-legacy, or set signals.disabled to route on router-local counts)", n, f)
	}
}

// tcpPort splits a tcp:// address into its host and port.
func tcpPort(addr string) (host string, port int, ok bool) {
	i := strings.LastIndexByte(addr, ':')
	if !strings.HasPrefix(addr, "tcp://") || i < len("tcp://") {
		return "", 0, false
	}
	port, err := strconv.Atoi(addr[i+1:])
	return addr[len("tcp://"):i], port, err == nil
}

// checkRankIDs reports the rank IDs of data-parallel endpoints (id#dp<r>)
// that another endpoint of the pool already has.
func checkRankIDs(v *validator, p string, eps []Endpoint) {
	owner := make(map[string]int, len(eps))
	first := make(map[string]int, len(eps)) // config ID -> first endpoint with it
	for i, e := range eps {
		if _, dup := first[e.ID]; !dup {
			first[e.ID] = i
		}
		// A data-parallel endpoint's own ID names its scrape in the
		// signals manager: it must not be another endpoint's rank ID either.
		if _, dup := owner[e.ID]; !dup {
			owner[e.ID] = i
		}
	}
	for i, e := range eps {
		if e.DataParallelSize <= 1 || e.DataParallelSize > MaxDataParallelSize || e.DataParallelStartRank < 0 || e.ID == "" || first[e.ID] != i {
			continue // not data-parallel, invalid, or a duplicate ID reported already
		}
		for r := range e.DataParallelSize {
			id := e.RankID(r)
			if j, dup := owner[id]; dup {
				v.addf(fmt.Sprintf("%s.endpoints[%d].id", p, i), "rank %d's ID %q (data_parallel_size %d) is %s.endpoints[%d]'s ID",
					e.DataParallelStartRank+r, id, e.DataParallelSize, p, j)
				break
			}
			owner[id] = i
		}
	}
}
