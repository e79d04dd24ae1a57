// Package browsertest starts headless Chromium for the dashboard's browser
// tests (packages ui and demo), through chromedp.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// Path finds a Chromium binary: $KVROUTE_CHROMIUM, or chromium,
// chromium-browser, google-chrome on PATH; "" when there is none.
func Path() string {
	if p := os.Getenv("KVROUTE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Require skips t without a Chromium binary or with -short, saying why.
func Require(t testing.TB) {
	t.Helper()
	if Path() == "" {
		t.Skip("no chromium binary found (install Debian's chromium package, or set KVROUTE_CHROMIUM)")
	}
	if testing.Short() {
		t.Skip("browser test: skipped with -short")
	}
}

// Start skips t as Require does; otherwise it starts headless Chromium with a fresh profile and a window of width x
// height pixels, for as long as ctx lasts, and returns the context of its
// first tab and a function that closes the browser early. The browser is
// closed and its profile removed when t ends (the profile after the
// browser has exited: t.TempDir's cleanup can race its last writes).
func Start(t testing.TB, ctx context.Context, width, height int) (context.Context, context.CancelFunc) {
	t.Helper()
	Require(t)
	profile, err := os.MkdirTemp("", "kvroute-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(profile) })
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(Path()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(width, height),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	return bctx, cancelBrowser
}
