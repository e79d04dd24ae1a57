package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
)

// fleet is the demo's emulated engines, each on its own loopback listener.
type fleet struct {
	engines []*engineProc
}

// engineProc is one emulated engine and its HTTP server.
type engineProc struct {
	id  string
	url string
	srv *emulator.Server
	hs  *http.Server
	ln  net.Listener
}

// newFleet builds n engines and binds their listeners; run serves them.
func newFleet(n int, model string, prof engine.Profile, blocks int, speed float64) (*fleet, error) {
	f := &fleet{}
	for i := range n {
		srv, err := emulator.New(emulator.Config{
			Model:  model,
			Engine: engine.Config{Profile: prof, NumGPUBlocks: blocks},
			Speed:  speed,
		})
		if err != nil {
			f.closeListeners()
			return nil, fmt.Errorf("demo: engine %d: %w", i, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.closeListeners()
			return nil, fmt.Errorf("demo: engine %d: %w", i, err)
		}
		f.engines = append(f.engines, &engineProc{
			id:  fmt.Sprintf("engine-%d", i),
			url: "http://" + ln.Addr().String(),
			srv: srv,
			hs:  &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second},
			ln:  ln,
		})
	}
	return f, nil
}

func (f *fleet) closeListeners() {
	for _, e := range f.engines {
		_ = e.ln.Close()
	}
}

// run serves every engine until ctx is done, then stops the servers and
// the engine loops and waits for all of them.
func (f *fleet) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, e := range f.engines {
		g.Go(func() error { return e.srv.Run(ctx) })
		g.Go(func() error {
			if err := e.hs.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("demo: %s: %w", e.id, err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := e.hs.Shutdown(sctx); err != nil {
				_ = e.hs.Close()
			}
			return nil
		})
	}
	return g.Wait()
}

// resetCaches empties every engine's prefix cache (vLLM's POST
// /reset_prefix_cache) so that each policy starts from cold caches.
func (f *fleet) resetCaches(ctx context.Context, client *http.Client) error {
	for _, e := range f.engines {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/reset_prefix_cache", nil)
		if err != nil {
			return err
		}
		// The engine refuses (409) while requests still hold blocks: the
		// previous phase's last streams may be finishing.
		for try := 0; ; try++ {
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("demo: reset %s: %w", e.id, err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			if resp.StatusCode != http.StatusConflict || try == 50 {
				return fmt.Errorf("demo: reset %s: HTTP %d", e.id, resp.StatusCode)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
