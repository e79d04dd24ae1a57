package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
)

// Serve serves the proxy on ln and runs the active health checks and the
// engine signals (RunSignals) until ctx is done. Then it stops accepting
// connections, lets in-flight requests (streams included) finish for up to
// timeouts.shutdown, closes whatever is left (cancelling those upstream
// requests), stops the background loops and returns. It returns nil after a
// shutdown asked for by ctx, else the server's error.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: p.cfg.Timeouts.ReadHeader,
		IdleTimeout:       p.cfg.Timeouts.Idle,
		MaxHeaderBytes:    p.cfg.Limits.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	hctx, stopHealth := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.RunHealthChecks(hctx) })
	wg.Go(func() { p.runUISampler(hctx) })
	wg.Go(func() {
		if err := p.RunSignals(hctx); err != nil {
			p.log.Error("engine signals stopped", "error", err)
		}
	})
	defer func() {
		stopHealth()
		wg.Wait()
	}()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	p.log.Info("serving", "addr", ln.Addr().String(), "models", p.names)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	p.draining.Store(true)
	p.log.Info("shutting down: draining in-flight requests", "deadline", p.cfg.Timeouts.Shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeouts.Shutdown)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		p.log.Warn("drain deadline passed: closing the remaining connections")
		err = srv.Close()
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	p.log.Info("stopped")
	return err
}
