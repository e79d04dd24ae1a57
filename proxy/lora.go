package proxy

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/signals"
)

// This file maps the forms a client names a LoRA adapter in to the pool
// and kvroute.Request.Adapter, and forwards a request in the form the
// chosen engine reads (openai.AdapterForm). A client may name an adapter
// as vLLM reads it ("model": "<adapter>") or as SGLang does ("model":
// "<base>:<adapter>", or "lora_path": "<adapter>" with the base model);
// routing is the same whichever form it used.

// resolveModel returns the pool of a request whose body has model and
// lora_path as in ri, and the LoRA adapter it names ("" for the base
// model), in this order:
//
//   - "model" is a served model: its pool;
//   - "model" is an adapter (config models[].adapters, vLLM's form): its
//     base model's pool;
//   - "model" is "<base>:<adapter>" (SGLang's form, split at the first
//     colon) with <base> a served model: its pool, and adapter when it
//     is one of <base>'s (else 404); an empty adapter names none;
//
// else the router's 404. Then "lora_path" (SGLang's field, one name for a
// batch: openai.RequestInfo.LoRAPath) names the adapter when "model" names
// none (404 if <base> has no such adapter), and must name the same one
// when it does: a request naming two adapters is a 400 naming both (SGLang
// would take the model's; the router does not guess which the client
// meant).
func (p *Proxy) resolveModel(ri *openai.RequestInfo) (*pool, string, error) {
	model := ri.Model
	pl, adapter := p.pools[model], ""
	if pl == nil {
		if pl = p.adapterPool(model); pl != nil {
			adapter = model
		}
	}
	if pl == nil {
		if base, a, ok := openai.SplitModelAdapter(model); ok && p.pools[base] != nil {
			pl, adapter = p.pools[base], a
			if a != "" && p.adapterPool(a) != pl {
				return nil, "", noAdapter(base, a, "model")
			}
		}
	}
	if pl == nil {
		return nil, "", kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "model_not_found", "model",
			"The model `%s` does not exist.", model)
	}
	switch lp := ri.LoRAPath; {
	case lp == "" || lp == adapter:
	case adapter == "":
		if p.adapterPool(lp) != pl {
			return nil, "", noAdapter(pl.model, lp, "lora_path")
		}
		adapter = lp
	default:
		return nil, "", kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "conflicting_adapters", "lora_path",
			"\"model\" (%q) names LoRA adapter %q and \"lora_path\" names %q: name one adapter, in either field", model, adapter, lp)
	}
	return pl, adapter, nil
}

// noAdapter is the 404 of an adapter that base model base does not have,
// named in field param (SGLang's forms).
func noAdapter(base, adapter, param string) error {
	return kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "model_not_found", param,
		"The model `%s` has no LoRA adapter `%s` (%s names it).", base, adapter, param)
}

// adapterFormOf is the form an engine of metrics flavour f reads an adapter
// in: vLLM's (and TGI's, whose OpenAI routes take "model" as the adapter_id,
// PR #2128; an id it has not loaded runs the base model), SGLang's and
// llama.cpp's; AdapterUnknown for an unknown flavour.
func adapterFormOf(f signals.Flavor) openai.AdapterForm {
	switch f {
	case signals.FlavorVLLM, signals.FlavorVLLMLegacy, signals.FlavorTGI:
		return openai.AdapterVLLM
	case signals.FlavorSGLang:
		return openai.AdapterSGLang
	case signals.FlavorLlamaCPP:
		return openai.AdapterLlamaCPP
	}
	return openai.AdapterUnknown
}

// configuredForms returns the adapter form of each of m's endpoints whose
// signals.flavor names its engine (the flavour, not auto), by router
// endpoint ID (each data-parallel rank's); nil when none does.
func configuredForms(m *config.Model) map[string]openai.AdapterForm {
	var forms map[string]openai.AdapterForm
	for id, e := range configByID(m) {
		if f := adapterFormOf(signals.Flavor(e.Signals.Flavor)); f != openai.AdapterUnknown {
			if forms == nil {
				forms = make(map[string]openai.AdapterForm)
			}
			forms[id] = f
		}
	}
	return forms
}

// adapterForm is the form endpoint up's engine reads an adapter in: its
// configured signals.flavor's (configuredForms), else the flavour its last
// scrape detected (signals.View.Flavor; signals.flavor auto), else
// AdapterUnknown (no scrape yet, scraping disabled). A P/D pool's engines
// are its protocol's (see pdAdapterForm).
func (pl *pool) adapterForm(up *endpointProxy) openai.AdapterForm {
	if f, ok := pl.set.Load().forms[up.ep.ID]; ok {
		return f
	}
	if v := pl.view(up); v != nil {
		return adapterFormOf(v.Flavor())
	}
	return openai.AdapterUnknown
}

// view returns endpoint up's signals.View in the router, nil if the router
// has none by its ID; looked up once per endpointProxy (the router keeps an
// endpoint's View while its engine stays; another engine under the ID has
// an endpointProxy of its own).
func (pl *pool) view(up *endpointProxy) *signals.View {
	if v := up.view.Load(); v != nil {
		return v
	}
	v := pl.router.View(up.ep.ID)
	if v != nil {
		up.view.Store(v)
	}
	return v
}

// attemptBody returns the body of an attempt on endpoint up, in the form
// its engine reads (adapterForm): for a llama.cpp server the request's
// adapter, or none, named by the ids of the adapters its scrapes listed
// (llamaBody); for another engine body as sent, or rewritten when the
// engine would not read the request's routing from it (bodyFor). named
// reports a rewrite; an *adapterMissing error, an engine that cannot run
// the adapter.
func (x *exchange) attemptBody(up *endpointProxy) (body []byte, named bool, err error) {
	switch f := x.pool.adapterForm(up); {
	case f == openai.AdapterLlamaCPP:
		var t *signals.LlamaAdapters
		if v := x.pool.view(up); v != nil {
			t = v.LlamaAdapters()
		}
		return x.naming.llamaBody(t, up.ep.ID, x.body, x.req)
	case x.naming.stale != 0:
		return x.naming.bodyFor(f, x.body, x.req)
	}
	return x.body, false, nil
}

// pdAdapterForm is the form a P/D pool's engines read an adapter in:
// pd.protocol nixl's are vLLM's, sglang's SGLang's.
func (pl *pool) pdAdapterForm() openai.AdapterForm {
	if pl.set.Load().model.PD.Protocol == "sglang" {
		return openai.AdapterSGLang
	}
	return openai.AdapterVLLM
}

// adapterNaming is how a request's body names its model and adapter, and
// the bodies rewritten for the engines that read another form.
type adapterNaming struct {
	model, loraPath string // the body's "model" and "lora_path" (openai.RequestInfo)
	// stale has bit 1<<form set for each form whose engine would not read
	// the request's routing (base model and adapter) from the body as sent.
	stale uint8
	named [3][]byte // the body rewritten for each form, once built
	// llama is the body last rewritten for a llama.cpp server, and the
	// adapter list (its ids) it was written for.
	llama      []byte
	llamaTable *signals.LlamaAdapters
}

// newAdapterNaming returns the naming of a request routed as req whose
// body has ri's model and lora_path.
func newAdapterNaming(ri *openai.RequestInfo, req *kvroute.Request) adapterNaming {
	n := adapterNaming{model: ri.Model, loraPath: ri.LoRAPath}
	for _, f := range []openai.AdapterForm{openai.AdapterVLLM, openai.AdapterSGLang} {
		if openai.AdapterRead(f, n.model, n.loraPath) != wantRead(f, req) {
			n.stale |= 1 << f
		}
	}
	return n
}

// wantRead is what an engine of form f must read from a request routed as
// req (openai.AdapterRead): for vLLM the adapter, or the base model for
// none; for SGLang the adapter ("" for none).
func wantRead(f openai.AdapterForm, req *kvroute.Request) string {
	if f == openai.AdapterVLLM && req.Adapter == "" {
		return req.Model
	}
	return req.Adapter
}

// bodyFor returns the body to send to an engine of form f: body itself
// (forwarded as its client wrote it) when the engine reads the request's
// routing from it or its form is unknown; else body rewritten in f
// (openai.NameAdapter), built once per form. named reports a rewrite.
func (n *adapterNaming) bodyFor(f openai.AdapterForm, body []byte, req *kvroute.Request) (out []byte, named bool, err error) {
	if f == openai.AdapterUnknown || n.stale&(1<<f) == 0 {
		return body, false, nil
	}
	if b := n.named[f]; b != nil {
		return b, true, nil
	}
	b, err := openai.NameAdapter(body, f, req.Model, req.Adapter)
	if err != nil {
		return nil, false, err
	}
	n.named[f] = b
	return b, true, nil
}

// namingError is the 400 of a body NameAdapter could not rewrite (a body
// ParseRequest accepted always decodes: this is a safety net).
func namingError(err error) error {
	return kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_body", "", "%v", fmt.Errorf("proxy: %w", err))
}

// llamaScale is the scale a request for adapter a runs it at on a
// llama.cpp server: its global scale as the server lists it (1 with
// --lora, the one given with --lora-scaled, the last POST
// /lora-adapters), or 1 where that is 0 (--lora-init-without-apply, or
// an adapter the operator turned off globally: a request that names it
// still wants it).
func llamaScale(a signals.LlamaAdapter) float64 {
	if a.Scale == 0 {
		return 1
	}
	return a.Scale
}

// llamaBody returns the body to send to a llama.cpp server whose adapters
// are t (its View's; nil when not read yet) for a request routed as req:
// every adapter of the server in "lora", the request's at llamaScale and
// the others at 0, so that no global scale applies (openai.AdapterLlamaCPP);
// built once per adapter list. A request for the base model goes as sent
// to a server that lists no adapters, or whose list is not known: nothing
// then to turn off. named reports a rewrite. An adapter the server does
// not list (t names none by req.Adapter: LlamaAdapters' names) is the
// router's 404, and one asked of a server whose list is not known yet its
// 503: the server cannot be told which adapter to run.
func (n *adapterNaming) llamaBody(t *signals.LlamaAdapters, endpoint string, body []byte, req *kvroute.Request) (out []byte, named bool, err error) {
	var want signals.LlamaAdapter
	if req.Adapter != "" {
		var ok bool
		if want, ok = t.Lookup(req.Adapter); !ok {
			return nil, false, notListed(t, endpoint, n.adapterParam(req.Adapter), req)
		}
	} else if t.Len() == 0 {
		return body, false, nil
	}
	if n.llama != nil && n.llamaTable == t {
		return n.llama, true, nil
	}
	lora := make([]openai.LoRAScale, 0, t.Len())
	for _, a := range t.List() {
		s := openai.LoRAScale{ID: a.ID}
		if req.Adapter != "" && a.ID == want.ID {
			s.Scale = llamaScale(a)
		}
		lora = append(lora, s)
	}
	b, err := openai.NameLlamaAdapter(body, req.Model, lora)
	if err != nil {
		return nil, false, err
	}
	n.llama, n.llamaTable = b, t
	return b, true, nil
}

// adapterParam is the field the client named adapter in: "model" (vLLM's
// form, or SGLang's "<base>:<adapter>"), else "lora_path".
func (n *adapterNaming) adapterParam(adapter string) string {
	if _, a, split := openai.SplitModelAdapter(n.model); n.model == adapter || split && a == adapter {
		return "model"
	}
	return "lora_path"
}

// adapterMissing is the error of an attempt whose engine cannot run the
// request's adapter (llamaBody): another endpoint may. Err is the
// client's answer when none does.
type adapterMissing struct{ err *kvroute.Error }

func (e *adapterMissing) Error() string { return e.err.Message }
func (e *adapterMissing) Unwrap() error { return e.err }

// notListed is llamaBody's error for req's adapter, named in the request's
// field param, on the llama.cpp server of endpoint, whose adapters are t:
// 404 model_not_found when t does not list it, 503 adapter_list_unknown
// when t is not known yet.
func notListed(t *signals.LlamaAdapters, endpoint, param string, req *kvroute.Request) error {
	if t == nil {
		return &adapterMissing{&kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable,
			Code: "adapter_list_unknown", Message: fmt.Sprintf(
				"The LoRA adapters of endpoint %s (llama.cpp) are not known yet: LoRA adapter `%s` of model `%s` cannot be named to it (the router reads GET /lora-adapters with the engine's metrics scrape).",
				endpoint, req.Adapter, req.Model)}}
	}
	listed := "none"
	if t.Len() > 0 {
		listed = strings.Join(t.Names(), ", ")
	}
	return &adapterMissing{&kvroute.Error{Status: http.StatusNotFound, Type: kvroute.TypeNotFound, Code: "model_not_found",
		Param: param, Message: fmt.Sprintf(
			"The model `%s` has no LoRA adapter `%s` on endpoint %s: its llama.cpp server lists %s (GET /lora-adapters: an adapter is named by its file name without .gguf, its path or its task_name).",
			req.Model, req.Adapter, endpoint, listed)}}
}
