//go:build !race

package kubernetes

// raceEnabled: see race_test.go.
const raceEnabled = false
