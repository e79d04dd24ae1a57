package signals

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
)

// TestSubscriberRedialBackoff: Run pauses between failed sessions with an
// exponential back-off (DialRetry times 1.6 per failure in a row, capped at
// MaxDialRetry), reset by a connection made, and re-dials at once after an
// idle session. (It paused DialRetry after every failure, forever: the
// subscribers of a fleet of engines restarting together re-dialled them all
// in lockstep, twice a second each.) Sessions are faked and the pauses
// recorded, the jitter fixed at its midpoint: no clock is read.
func TestSubscriberRedialBackoff(t *testing.T) {
	const ms = time.Millisecond
	sub, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1",
		Sink: kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4}), DialRetry: 100 * ms, MaxDialRetry: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sub.retry.rnd = func() float64 { return 0.5 } // a factor of exactly 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The sessions' outcomes, in order: a failed dial, a connection that
	// failed later, an idle connection; the last one ends Run.
	script := []string{"fail", "fail", "fail", "fail", "fail", "fail", "fail", "conn", "fail", "fail", "idle", "fail", "stop"}
	var got []string
	var pauses []time.Duration
	sub.runSession = func(context.Context) error {
		step := script[len(got)]
		got = append(got, step)
		sub.up = step == "conn" || step == "idle"
		switch step {
		case "conn":
			sub.lost = false // as session does once connected
			return errors.New("recv: connection reset")
		case "idle":
			sub.lost = false
			return errIdle
		case "stop":
			cancel()
			return nil
		}
		return errors.New("dial: connection refused")
	}
	sub.pause = func(_ context.Context, d time.Duration) bool {
		pauses = append(pauses, d)
		return true
	}
	if err := sub.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{
		100 * ms, 160 * ms, 256 * ms, 409600 * time.Microsecond, 655360 * time.Microsecond, time.Second, time.Second, // capped
		100 * ms, 160 * ms, 256 * ms, // the connection reset the streak
		// idle: no pause
		100 * ms, // the idle connection was a connection: reset
	}
	if len(got) != len(script) || !equalDurations(pauses, want) {
		t.Fatalf("sessions %v, pauses %v; want %d sessions, pauses %v", got, pauses, len(script), want)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if d := a[i] - b[i]; d < -time.Microsecond || d > time.Microsecond {
			return false
		}
	}
	return true
}

// TestBackoffJitter: each pause lies within ±20% of its nominal value,
// a seeded random source gives the same pauses every time (tests can
// predict them), and the subscribers of 64 engines that failed together
// do not pause alike: their re-dials spread out instead of coming in
// lockstep.
func TestBackoffJitter(t *testing.T) {
	const base, maxD = 500 * time.Millisecond, 5 * time.Second
	pausesOf := func(seed uint64, n int) []time.Duration {
		b := backoff{base: base, max: maxD, rnd: rand.New(rand.NewPCG(seed, 1)).Float64}
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = b.next()
		}
		return out
	}
	nominal := float64(base)
	for i, d := range pausesOf(7, 12) {
		lo, hi := time.Duration(0.8*nominal), time.Duration(1.2*nominal)
		if d < lo || d >= hi {
			t.Errorf("pause %d: got %v, want in [%v, %v)", i, d, lo, hi)
		}
		nominal = min(nominal*1.6, float64(maxD))
	}
	if a, b := pausesOf(7, 12), pausesOf(7, 12); !equalDurations(a, b) {
		t.Errorf("same seed: got %v and %v, want equal", a, b)
	}
	seen := make(map[time.Duration]int)
	for e := range uint64(64) {
		first := pausesOf(e, 1)[0]
		if prev, ok := seen[first]; ok {
			t.Errorf("engines %d and %d: first pause %v alike", prev, e, first)
		}
		seen[first] = int(e)
	}
}

// TestSubscriberMaxDialRetryDefaults: MaxDialRetry defaults to 5s and is at
// least DialRetry.
func TestSubscriberMaxDialRetryDefaults(t *testing.T) {
	for _, tc := range []struct {
		dial, max, want time.Duration
	}{
		{0, 0, 5 * time.Second},
		{time.Millisecond, 0, 5 * time.Second},
		{10 * time.Second, 0, 10 * time.Second},
		{time.Second, 2 * time.Second, 2 * time.Second},
	} {
		sub, err := NewSubscriber(SubscriberConfig{Endpoint: "e1", Address: "tcp://127.0.0.1:1",
			Sink: kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 4}), DialRetry: tc.dial, MaxDialRetry: tc.max})
		if err != nil {
			t.Fatal(err)
		}
		if got := sub.retry.max; got != tc.want {
			t.Errorf("DialRetry %v, MaxDialRetry %v: got cap %v, want %v", tc.dial, tc.max, got, tc.want)
		}
	}
}
