package proxy

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// modelList is the body of GET /v1/models.
type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Parent is a LoRA adapter's base model, as vLLM's /v1/models lists
	// an adapter (serving_models.py: parent=lora.base_model_name); left
	// out for a base model.
	Parent string `json:"parent,omitempty"`
}

// serveModels lists the configured models (the union of every pool), then
// their LoRA adapters, each with its base model as its parent, as vLLM
// lists its base models and then its adapters.
func (p *Proxy) serveModels(w http.ResponseWriter, _ *http.Request) {
	ad := p.adapters.Load()
	l := modelList{Object: "list", Data: make([]modelCard, 0, len(p.names)+len(ad.names))}
	for _, n := range p.names {
		l.Data = append(l.Data, modelCard{ID: n, Object: "model", Created: p.started.Unix(), OwnedBy: "kvroute"})
	}
	for _, a := range ad.names {
		l.Data = append(l.Data, modelCard{ID: a, Object: "model", Created: p.started.Unix(), OwnedBy: "kvroute", Parent: ad.pools[a].model})
	}
	writeJSON(w, http.StatusOK, l)
}

// serveHealthz reports that the process is up.
func (p *Proxy) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// serveReadyz is 200 when the proxy is not shutting down and every model
// has a healthy endpoint, a prefill/decode model one that can decode (role
// decode or both: without a prefill engine the planner runs requests whole
// on decode engines, rule no_prefill, but a prefill engine alone serves
// nothing), else 503 with the models that have none (and, among them,
// those whose discovery could not start), and the P/D models without a
// healthy decode endpoint. While
// the active health checks run (Serve), an endpoint counts only once its
// probe has passed a check: at start the router is not ready until each
// model has an endpoint that answered, and an endpoint added later (a
// reload, a discovery) counts from its first check passed, which does not
// make a model whose other endpoints are healthy unready meanwhile.
func (p *Proxy) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	if p.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	now := p.now()
	var down, notRunning, noDecode []string
	for _, n := range p.names {
		pl := p.pools[n]
		passed, gated := p.health.passedBy(n)
		up, decode := false, false
		for _, st := range pl.router.Status(now) {
			if !st.Healthy || (gated && !passed[st.ID]) {
				continue
			}
			r, err := kvroute.ParseRole(st.Role)
			up = true
			decode = decode || (err == nil && r.CanDecode())
		}
		switch {
		case !up:
			down = append(down, n)
			if pl.disc != nil && pl.disc.notRunning() != nil {
				notRunning = append(notRunning, n)
			}
		case pl.pd != nil && !decode:
			noDecode = append(noDecode, n)
		}
	}
	if len(down)+len(noDecode) > 0 {
		body := map[string]any{"status": "unavailable"}
		for k, l := range map[string][]string{
			"models_without_healthy_endpoint":        down,
			"models_without_running_discovery":       notRunning,
			"models_without_healthy_decode_endpoint": noDecode,
		} {
			if len(l) > 0 {
				body[k] = l
			}
		}
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// authorized reports whether the request carries the admin bearer token.
func (p *Proxy) authorized(r *http.Request) bool {
	tok := p.cfg.Admin.Token
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if tok == "" || len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), []byte(tok)) == 1
}

// Refusals of the admin and debug endpoints. With an admin token
// configured, a request without it (or with another) is unauthenticated:
// 401 with a Bearer challenge (RFC 6750), so a client knows to send the
// token. Without one, no credential can open the endpoint: 403.
var (
	errUnauthorized = kvroute.Errorf(http.StatusUnauthorized, "authentication_error", "invalid_token", "",
		"this endpoint needs the admin token: Authorization: Bearer <admin.token>")
	errForbidden = kvroute.Errorf(http.StatusForbidden, "permission_error", "forbidden", "",
		"this endpoint is closed: the router has no admin.token and debug.enabled is false")
)

// refuse answers a request that authorized refused.
func (p *Proxy) refuse(w http.ResponseWriter) {
	if p.cfg.Admin.Token == "" {
		openai.WriteError(w, errForbidden)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
	openai.WriteError(w, errUnauthorized)
}

// debugAllowed: debug endpoints are open when debug.enabled, else they need
// the admin token.
func (p *Proxy) debugAllowed(w http.ResponseWriter, r *http.Request) bool {
	if p.cfg.Debug.Enabled || p.authorized(r) {
		return true
	}
	p.refuse(w)
	return false
}

// serveDecisions returns recent routing decisions, newest first:
// ?model=NAME (default every model) and ?n=COUNT (default 50).
func (p *Proxy) serveDecisions(w http.ResponseWriter, r *http.Request) {
	if !p.debugAllowed(w, r) {
		return
	}
	n := 50
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			openai.WriteError(w, kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_value", "n",
				"n must be a positive integer, got %q", s))
			return
		}
		n = v
	}
	names, ok := p.selectModels(w, r)
	if !ok {
		return
	}
	out := make(map[string][]router.DecisionRecord, len(names))
	for _, name := range names {
		out[name] = p.pools[name].router.Decisions(n)
	}
	writeJSON(w, http.StatusOK, out)
}

// serveEndpoints returns every endpoint's health and load: ?model=NAME.
func (p *Proxy) serveEndpoints(w http.ResponseWriter, r *http.Request) {
	if !p.debugAllowed(w, r) {
		return
	}
	names, ok := p.selectModels(w, r)
	if !ok {
		return
	}
	now := p.now()
	type model struct {
		// Policy names what places the requests, as their decisions do:
		// on a P/D pool the planner ("pd"), PrefillPolicy then being the
		// configured policy that places the prefill stage.
		Policy        string                  `json:"policy"`
		PrefillPolicy string                  `json:"prefill_policy,omitempty"`
		Endpoints     []router.EndpointStatus `json:"endpoints"`
	}
	out := make(map[string]model, len(names))
	for _, name := range names {
		pl := p.pools[name]
		m := model{Policy: pl.router.Policy(), Endpoints: pl.router.Status(now)}
		if pl.pd != nil {
			m.Policy, m.PrefillPolicy = disagg.PolicyName, m.Policy
		}
		out[name] = m
	}
	writeJSON(w, http.StatusOK, out)
}

func (p *Proxy) selectModels(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	m := r.URL.Query().Get("model")
	if m == "" {
		return p.names, true
	}
	if p.pools[m] == nil {
		openai.WriteError(w, kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "model_not_found", "model",
			"model %q is not served here", m))
		return nil, false
	}
	return []string{m}, true
}

// PolicyUpdate is the body of PUT /admin/policy.
type PolicyUpdate struct {
	Model  string         `json:"model"`
	Policy string         `json:"policy"`
	Params map[string]any `json:"params"`
}

// maxAdminBody bounds the body of PUT /admin/policy.
const maxAdminBody = 1 << 20

// serveAdminPolicy switches a model's policy at runtime. It exists only
// when admin.token is set and needs that token.
func (p *Proxy) serveAdminPolicy(w http.ResponseWriter, r *http.Request) {
	if !p.authorized(r) {
		p.refuse(w)
		return
	}
	var u PolicyUpdate
	// A body over the limit fails with 413; cut short by a LimitReader it
	// was answered 400 "unexpected EOF", as if the JSON were broken.
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	err := dec.Decode(&u)
	if err == nil {
		// One object and nothing after it: the end of the body must follow.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		openai.WriteError(w, tooLarge(mbe.Limit))
		return
	}
	if err != nil {
		openai.WriteError(w, kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_json", "",
			"body must be {\"model\",\"policy\",\"params\"}: %v", err))
		return
	}
	if u.Model == "" || u.Policy == "" {
		openai.WriteError(w, kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "missing_field", "",
			"\"model\" and \"policy\" are required"))
		return
	}
	if err := p.SetPolicy(u.Model, u.Policy, normalizeNumbers(u.Params)); err != nil {
		openai.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"model": u.Model, "policy": u.Policy})
}

// normalizeNumbers turns json.Number values into int (when integral) or
// float64, as YAML config parameters arrive.
func normalizeNumbers(m map[string]any) map[string]any {
	for k, v := range m {
		switch t := v.(type) {
		case json.Number:
			if i, err := t.Int64(); err == nil {
				m[k] = int(i)
			} else if f, err := t.Float64(); err == nil {
				m[k] = f
			}
		case map[string]any:
			m[k] = normalizeNumbers(t)
		}
	}
	return m
}
