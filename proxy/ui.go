package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/ui"
)

// PathUI is where the live fleet dashboard is served.
const PathUI = "/ui/"

// mountUI mounts the dashboard (package ui) at /ui. Its state API is as
// protected as /debug/*: open with debug.enabled, else it needs the admin
// token (the page asks for it); the page and its assets are public.
func (p *Proxy) mountUI(mux *http.ServeMux) {
	d, err := ui.New(ui.Options{
		Source:       p,
		Gatherer:     p.gatherer,
		AdminEnabled: p.cfg.Admin.Token != "",
		Logger:       p.log,
		Now:          p.now,
		Authorize:    func(r *http.Request) bool { return p.cfg.Debug.Enabled || p.authorized(r) },
	})
	if err != nil {
		p.log.Error("dashboard disabled", "error", err)
		return
	}
	p.ui = d
	mux.Handle(PathUI, d)
	mux.Handle("/ui", http.RedirectHandler(PathUI, http.StatusMovedPermanently))
}

// runUISampler records a point of the dashboard's charts every second until
// ctx ends. Serve runs it.
func (p *Proxy) runUISampler(ctx context.Context) {
	if p.ui == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.ui.Sample(p.now())
		}
	}
}
