package ui_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/ui"
)

// pool is a Source with one model (a *proxy.Proxy is one too).
type pool struct{ r *router.Router }

func (p pool) Models() []string             { return []string{p.r.Model()} }
func (p pool) Router(string) *router.Router { return p.r }

func Example() {
	pk, _ := policy.New("round_robin", nil, 1)
	r, _ := router.New(router.Config{Model: "llama", Policy: "round_robin", Picker: pk,
		Endpoints: []kvroute.Endpoint{{ID: "gpu-0", URL: "http://10.0.0.7:8000"}}})
	d, err := ui.New(ui.Options{Source: pool{r}})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", d) // the page at /ui/, its state at /ui/api/state

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output: 200 application/json
}
