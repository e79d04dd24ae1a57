package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/config"
)

// Headers the proxy reads or writes.
const (
	// HeaderRequestID carries the request ID to the engine and back to the
	// client; a client's own (1-128 characters of [A-Za-z0-9._:-]) is kept.
	HeaderRequestID = "X-Request-Id"
	// HeaderSession is the default header of the session affinity key
	// (a model's router.session.header names another).
	HeaderSession = config.DefaultSessionHeader
	// HeaderRoutingPrefix starts every header that carries routing
	// instructions; they are stripped unless the client is trusted.
	HeaderRoutingPrefix = "X-Kvroute-"
	// HeaderKVSession is a trusted client's session key (wins over
	// HeaderSession).
	HeaderKVSession = "X-Kvroute-Session"
	// HeaderTenant is a trusted client's tenant (wins over the API key and
	// the "user" field; see tenantOf).
	HeaderTenant = "X-Kvroute-Tenant"
	// HeaderEndpoint names the chosen endpoint on responses when debug is on.
	HeaderEndpoint = "X-Kvroute-Endpoint"
)

// trustedClient reports whether the request comes from a trusted address.
func (p *Proxy) trustedClient(r *http.Request) bool {
	if len(p.trusted) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, pfx := range p.trusted {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// stripRoutingHeaders removes every x-kvroute-* header from an untrusted
// client's request, so it cannot steer routing.
func (p *Proxy) stripRoutingHeaders(r *http.Request) {
	if p.trustedClient(r) {
		return
	}
	for k := range r.Header {
		if len(k) >= len(HeaderRoutingPrefix) && strings.EqualFold(k[:len(HeaderRoutingPrefix)], HeaderRoutingPrefix) {
			delete(r.Header, k)
		}
	}
}

// The forwarding headers the engines get on every request (the
// aggregated path's and each P/D leg's), as Caddy and nginx set them.
const (
	headerForwardedFor   = "X-Forwarded-For"
	headerForwardedHost  = "X-Forwarded-Host"
	headerForwardedProto = "X-Forwarded-Proto"
)

// forwardedHeaders are the headers setForwarded writes.
var forwardedHeaders = []string{headerForwardedFor, headerForwardedHost, headerForwardedProto}

// setForwarded sets r's forwarding headers to what the engines should see:
// X-Forwarded-For is the client's address, X-Forwarded-Host the host it
// asked for and X-Forwarded-Proto the scheme it used ("http" or "https").
// A trusted client (trusted_clients: a gateway in front of the router)
// keeps the X-Forwarded-For it sent, the router appending the gateway's
// address (httputil.ProxyRequest.SetXForwarded), and the X-Forwarded-Host
// and X-Forwarded-Proto it sent; any other client's forwarding headers
// are dropped, as it could otherwise put any address in the engines' logs.
// The standard Forwarded header is never passed on.
func setForwarded(r *http.Request, trusted bool) {
	h := r.Header
	var prior []string
	if trusted {
		prior = h.Values(headerForwardedFor)
	}
	for _, k := range forwardedHeaders {
		if !trusted {
			delete(h, k)
		}
	}
	delete(h, "Forwarded")
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set(headerForwardedFor, ip)
	}
	if h.Get(headerForwardedHost) == "" && r.Host != "" {
		h.Set(headerForwardedHost, r.Host)
	}
	if h.Get(headerForwardedProto) == "" {
		proto := "http"
		if r.TLS != nil {
			proto = "https"
		}
		h.Set(headerForwardedProto, proto)
	}
}

// requestID returns the client's request ID when it is sane, else a new one.
func requestID(r *http.Request) string {
	if id := r.Header.Get(HeaderRequestID); validRequestID(id) {
		return id
	}
	return newRequestID()
}

func newRequestID() string {
	var b [20]byte
	buf := append(b[:0], "kvr-"...)
	buf = strconv.AppendUint(buf, rand.Uint64(), 36)
	return string(buf)
}

// idSet holds the routing IDs of the requests in progress. The routing
// core names a request by kvroute.Request.ID (kv-aware keeps each routed
// request's queued prefill and load under it until the request is done), so
// two requests in progress must not share one; a client's X-Request-Id is
// not unique (clients reuse one, or send a fixed one on every request). It
// is safe for concurrent use.
type idSet struct {
	mu sync.Mutex          // guards m
	m  map[string]struct{} // the IDs claimed and not yet released
}

// claim returns id when no request in progress has it, else id with a
// fresh suffix (".kvr-..."), and holds the result until release.
func (s *idSet) claim(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]struct{})
	}
	for k := id; ; k = id + "." + newRequestID() {
		if _, taken := s.m[k]; !taken {
			s.m[k] = struct{}{}
			return k
		}
	}
}

// release ends the hold of a claimed ID.
func (s *idSet) release(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

func validRequestID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// tenantOf returns the tenant a request counts against for fairness
// (kv-aware's tenant cap, the queue's turns): a trusted client's
// HeaderTenant; else the API key it authenticates with (Authorization:
// Bearer), which a client cannot mint at will as it can "user" values,
// named "key:" and a digest so that no log, decision or metric shows the
// key; else the body's "user" field ("" for none: the default tenant), one
// that starts with "key:" prefixed with "user:" (a client without the key
// would otherwise join the key's tenant by naming its digest, which
// /debug/decisions shows).
func tenantOf(r *http.Request, trusted bool, user string) string {
	if trusted {
		if t := r.Header.Get(HeaderTenant); t != "" {
			return t
		}
	}
	if key := bearerToken(r.Header.Get("Authorization")); key != "" {
		sum := sha256.Sum256([]byte(key))
		return "key:" + hex.EncodeToString(sum[:8])
	}
	if strings.HasPrefix(user, "key:") {
		return "user:" + user
	}
	return user
}

// bearerToken returns the token of an "Authorization: Bearer TOKEN" value
// (the scheme is case-insensitive), or "".
func bearerToken(auth string) string {
	const scheme = "bearer "
	if len(auth) <= len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
		return ""
	}
	return strings.TrimSpace(auth[len(scheme):])
}
