package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// shutdownGrace is how long the requests ended at the drain deadline have
// to write their end before their connections are closed.
const shutdownGrace = time.Second

// Serve serves the proxy on ln and runs the active health checks, the
// engine signals (RunSignals) and the models' endpoint discoveries
// (RunDiscovery) until ctx is done. Then it stops accepting
// connections, lets in-flight requests (streams included) finish for up to
// timeouts.shutdown, then ends whatever is left: their upstream requests
// are cancelled, a stream ends with an error event (503) and "data: [DONE]",
// a request with no response yet is answered 503; after up to a second
// more for that, the remaining connections are closed. It stops the
// background loops and returns. It returns nil after a shutdown asked for
// by ctx, else the server's error; a server that fails (its listener)
// drains and ends its in-flight requests the same way before returning.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: p.cfg.Timeouts.ReadHeader,
		IdleTimeout:       p.cfg.Timeouts.Idle,
		MaxHeaderBytes:    p.cfg.Limits.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	// Every request's context descends from base: at the drain deadline
	// cancelling it with errShutdown ends the requests still in progress,
	// and they tell their clients why (context.Cause).
	base, stopAll := context.WithCancelCause(context.Background())
	defer stopAll(nil)
	srv.BaseContext = func(net.Listener) context.Context { return base }
	hctx, stopHealth := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	p.health.expect(p) // /readyz waits for the probes from the first connection
	wg.Go(func() { _ = p.RunHealthChecks(hctx) })
	wg.Go(func() { p.runUISampler(hctx) })
	wg.Go(func() {
		if err := p.RunSignals(hctx); err != nil {
			p.log.Error("engine signals stopped", "error", err)
		}
	})
	wg.Go(func() {
		if err := p.RunDiscovery(hctx); err != nil {
			p.log.Error("endpoint discovery stopped", "error", err)
		}
	})
	defer func() {
		stopHealth()
		wg.Wait()
	}()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	p.log.Info("serving", "addr", ln.Addr().String(), "models", p.names)
	var serveErr error // the server's own end (its listener failed), before any shutdown
	select {
	case serveErr = <-errc:
		// The connections still open are drained as at a shutdown: left
		// alone, their requests ran on after Serve returned, with no one
		// to end them.
		p.log.Error("the listener failed: draining in-flight requests", "error", serveErr)
	case <-ctx.Done():
	}
	p.draining.Store(true)
	p.log.Info("shutting down: draining in-flight requests", "deadline", p.cfg.Timeouts.Shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeouts.Shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// End what is left: streams with an error event and [DONE], the
		// others with a 503 when nothing was sent yet; give the handlers
		// a moment to say so and return, then close the connections.
		p.log.Warn("drain deadline passed: ending the requests still in progress")
		stopAll(errShutdown)
		gctx, gcancel := context.WithTimeout(context.Background(), shutdownGrace)
		if srv.Shutdown(gctx) != nil {
			_ = srv.Close()
		}
		gcancel()
		err = nil
	}
	if serveErr != nil {
		err = serveErr
	} else if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	p.log.Info("stopped")
	return err
}
