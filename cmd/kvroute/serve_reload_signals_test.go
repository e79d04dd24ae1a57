package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

// TestReloadModelSignalsFromFile: serve's SIGHUP loader reads the file
// again; a model-level signals setting changed in it needs a restart
// (the reload says so) and is not applied to the model's endpoints,
// which inherit it, as an endpoint change. The loader gave Reload the
// file with its defaults applied (config.Parse), the model's setting
// copied into each endpoint's own, so every endpoint of the model was
// re-applied with the file's new interval; it now gives the file as
// written (config.Decode).
func TestReloadModelSignalsFromFile(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer eng.Close()
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	write := func(interval string, own ...string) {
		t.Helper()
		yaml := "models:\n  - name: m\n    signals: {scrape_interval: " + interval + "}\n    endpoints:\n      - url: " + eng.URL + "\n"
		for _, o := range own {
			yaml += "        signals: {scrape_interval: " + o + "}\n"
		}
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("700ms")
	cfg, err := loadConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New})
	if err != nil {
		t.Fatal(err)
	}
	// The file as it started: nothing to apply, nothing needs a restart.
	if res, err := p.Reload(fileLoader(file, func(*config.Config) {})); err != nil || len(res.Models)+len(res.Restart) != 0 {
		t.Errorf("reload of the unchanged file: %+v, %v; want no change", res, err)
	}
	write("50ms")
	res, err := p.Reload(fileLoader(file, func(*config.Config) {}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Models) != 0 || !slices.Equal(res.Restart, []string{"models[0].signals"}) {
		t.Errorf("reload of the model's scrape_interval: models changed %+v, restart %q; "+
			"want no endpoint change and models[0].signals needing a restart", res.Models, res.Restart)
	}
	// A file invalid as written is refused as at the start, naming the
	// file and the field, even where a flag would override the value.
	if err := os.WriteFile(file, []byte("listen: nope\nmodels: [{name: m, endpoints: [{url: '"+eng.URL+"'}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(fileLoader(file, func(c *config.Config) { c.Listen = "127.0.0.1:0" })); err == nil ||
		!strings.Contains(err.Error(), "config "+file+": listen:") {
		t.Errorf("reload of a file with an invalid listen: got %v, want the file's listen refused", err)
	}
	// The endpoint's own setting is the endpoint's: it changes live.
	write("50ms", "20ms")
	if res, err := p.Reload(fileLoader(file, func(*config.Config) {})); err != nil || len(res.Models) != 1 {
		t.Errorf("reload of the endpoint's own scrape_interval: %+v, %v; want model m changed", res, err)
	}
}
