//go:build race

package kubernetes

// raceEnabled reports whether this test binary was built with -race:
// TestRouterBinary builds kvroute the same way, so that the packages the
// test run compiled already are reused from the build cache.
const raceEnabled = true
