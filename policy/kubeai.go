package policy

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute"
)

// KubeAIParams configures the kubeai-chwbl baseline; defaults are KubeAI's
// (api/k8s/v1/model_types.go PrefixHash defaults).
type KubeAIParams struct {
	// MeanLoadFactor is the bound in percent of the mean in-flight load.
	// Default 125.
	MeanLoadFactor int `param:"mean_load_factor"`
	// Replication is the number of virtual nodes per endpoint. Default 256.
	Replication int `param:"replication"`
	// PrefixCharLength is the number of characters of the first user message
	// (or of the first completion prompt) hashed into the key. Default 100.
	PrefixCharLength int `param:"prefix_char_length"`
}

// KubeAI reproduces KubeAI's PrefixHash load balancing strategy, consistent
// hashing with bounded loads (substratusai/kubeai
// internal/loadbalancer/balance_chwbl.go, api/openai/v1 Prefix):
//
//   - key = the first PrefixCharLength characters of the first "user"
//     message (chat) or of the first prompt (completions), hashed with
//     xxhash (XXH64);
//   - ring: Replication virtual nodes per endpoint at xxhash(name + i);
//   - walk clockwise from the key and take the first endpoint with
//     in-flight + 1 <= (total in-flight + 1) / n x MeanLoadFactor/100
//     (any endpoint when nothing is in flight); if none qualifies, the first
//     endpoint visited.
//
// The text comes from Request.Prompt in the canonical form of package openai
// (chat: kvroute's canonical chat form, kvroute.ForEachChatMessage; a batch
// of completion prompts: netstrings); a prompt in neither form is treated as
// a single completion prompt. Unhealthy endpoints
// are skipped on the walk, which is the same as leaving them off the ring.
// Endpoint weights are ignored, as KubeAI's endpoints have none.
// Defaults: mean_load_factor 125, replication 256, prefix_char_length 100.
// Not safe for concurrent use.
type KubeAI struct {
	buf  scoreBuf // explanation buffers, reused
	p    KubeAIParams
	ring *ring
}

var _ kvroute.Picker = (*KubeAI)(nil)

func newKubeAI(params map[string]any, _ uint64) (*KubeAI, error) {
	p := KubeAIParams{MeanLoadFactor: 125, Replication: 256, PrefixCharLength: 100}
	if err := decodeParams(NameKubeAICHWBL, params, &p); err != nil {
		return nil, err
	}
	for _, c := range []error{
		check(NameKubeAICHWBL, "mean_load_factor", p.MeanLoadFactor >= 100, "must be >= 100, got %d", p.MeanLoadFactor),
		check(NameKubeAICHWBL, "replication", p.Replication >= 1 && p.Replication <= 4096, "must be in [1, 4096], got %d", p.Replication),
		check(NameKubeAICHWBL, "prefix_char_length", p.PrefixCharLength >= 1, "must be >= 1, got %d", p.PrefixCharLength),
	} {
		if c != nil {
			return nil, c
		}
	}
	return &KubeAI{p: p, ring: newRing(p.Replication, kubeaiVnodeHash, false)}, nil
}

// kubeaiVnodeHash is chwblHashEndpointReplica: xxhash of fmt "%s%d".
func kubeaiVnodeHash(name string, replica int) uint64 {
	var buf [128]byte
	b := append(buf[:0], name...)
	b = strconv.AppendInt(b, int64(replica), 10)
	return xxhash.Sum64(b)
}

// Pick implements kvroute.Picker.
func (k *KubeAI) Pick(_ time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	req = orEmpty(req)
	scores := k.buf.get(cands, 1)
	total, n := 0, 0
	for i := range cands {
		if cands[i].Healthy {
			total += cands[i].Load.InFlight
			n++
			scores[i].Value = float64(cands[i].Load.InFlight)
			scores[i].Parts = append(scores[i].Parts, kvroute.Part{Name: "in_flight", Value: float64(cands[i].Load.InFlight)})
		}
	}
	if n == 0 {
		return noneHealthy(NameKubeAICHWBL, cands, scores)
	}
	k.ring.sync(cands)
	factor := float64(k.p.MeanLoadFactor) / 100
	first := -1
	got := k.ring.walk(xxhash.Sum64String(KubeAIKey(req.Prompt, k.p.PrefixCharLength)), func(c int) bool {
		if !cands[c].Healthy {
			return false
		}
		if first < 0 {
			first = c
		}
		if chwblOK(cands[c].Load.InFlight, total, n, factor) {
			return true
		}
		scores[c].Why = "over bounded load, walked on"
		return false
	})
	if got < 0 {
		return chose(NameKubeAICHWBL, cands, first, "every endpoint over the bound: first on the ring", scores)
	}
	return chose(NameKubeAICHWBL, cands, got, "ring owner within bounded load", scores)
}

// KubeAIKey returns the text KubeAI hashes: the first n characters of the
// first user message of a canonical chat prompt (kvroute.ForEachChatMessage),
// or of the first prompt of a completion (a netstring batch or plain text).
func KubeAIKey(prompt string, n int) string {
	key, found := "", false
	if kvroute.ForEachChatMessage(prompt, func(role, content string) bool {
		if role == "user" {
			key, found = content, true
			return false
		}
		return true
	}) {
		if found {
			return firstChars(key, n)
		}
		return ""
	}
	if msgs, ok := splitNetstrings(prompt); ok && len(msgs) > 0 {
		return firstChars(prompt[msgs[0][0]:msgs[0][1]], n)
	}
	return firstChars(prompt, n)
}

// splitNetstrings splits s, when it is entirely a sequence of netstrings
// ("<len>:<bytes>,"), into the [start, end) offsets of their payloads. It
// allocates only for more than 16 parts.
func splitNetstrings(s string) ([][2]int, bool) {
	if s == "" {
		return nil, false
	}
	var small [16][2]int
	parts := small[:0]
	i := 0
	for i < len(s) {
		j := i
		n := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			if j-i > 9 {
				return nil, false
			}
			n = n*10 + int(s[j]-'0')
			j++
		}
		if j == i || j >= len(s) || s[j] != ':' || (s[i] == '0' && j-i > 1) {
			return nil, false
		}
		start := j + 1
		end := start + n
		if end >= len(s) || s[end] != ',' {
			return nil, false
		}
		parts = append(parts, [2]int{start, end})
		i = end + 1
	}
	return parts, true
}

// firstChars returns the first n characters (runes) of s.
func firstChars(s string, n int) string {
	i := 0
	for k := 0; k < n; k++ {
		if i >= len(s) {
			return s
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i]
}
