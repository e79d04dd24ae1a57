package report

import (
	"sort"
	"time"
)

// Occupancy returns the number of requests in flight over time, one series
// per engine (a single series named "all" when no sample names an engine),
// sampled at points evenly spaced instants from the first arrival to the
// last completion. X is in seconds since the first arrival. It is the
// utilisation view bench can measure from the client side.
func Occupancy(samples []Sample, points int) []Series {
	if len(samples) == 0 || points < 2 {
		return nil
	}
	first, last := samples[0].Arrival, samples[0].Arrival+samples[0].E2E
	byEngine := map[string][]Sample{}
	for _, s := range samples {
		first = min(first, s.Arrival)
		last = max(last, s.Arrival+s.E2E)
		name := s.Engine
		if name == "" {
			name = "all"
		}
		byEngine[name] = append(byEngine[name], s)
	}
	if _, only := byEngine["all"]; only && len(byEngine) > 1 {
		// Some samples (errors) have no engine: keep them apart.
		byEngine["(none)"] = byEngine["all"]
		delete(byEngine, "all")
	}
	span := last - first
	if span <= 0 {
		span = time.Millisecond
	}
	var out []Series
	for _, name := range sortedKeys(byEngine) {
		ss := byEngine[name]
		starts := make([]time.Duration, len(ss))
		ends := make([]time.Duration, len(ss))
		for i, s := range ss {
			starts[i], ends[i] = s.Arrival, s.Arrival+s.E2E
		}
		sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
		sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
		ser := Series{Name: name}
		for p := range points {
			t := first + time.Duration(float64(span)*float64(p)/float64(points-1))
			// In flight at t: started at or before t and not yet ended.
			started := sort.Search(len(starts), func(i int) bool { return starts[i] > t })
			ended := sort.Search(len(ends), func(i int) bool { return ends[i] > t })
			ser.X = append(ser.X, (t - first).Seconds())
			ser.Y = append(ser.Y, float64(started-ended))
		}
		out = append(out, ser)
	}
	return out
}
