package planner

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the plan as indented JSON (durations in nanoseconds).
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the plan for a terminal: the workload, the bounds with
// their arithmetic, the simulated search, the two fleets side by side and the
// hot prefixes.
func (r *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	r.writeText(&b, false)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Result) header(b *strings.Builder) {
	d := r.Demand
	fmt.Fprintf(b, "kvroute plan [%s]: %s (%s on %d x %s)\n", r.Name, r.Profile, r.Model, r.TP, r.GPU)
	fmt.Fprintf(b, "workload: %s\n", r.Workload)
	fmt.Fprintf(b, "  %d requests over %s, %.2f req/s (inter-arrival CV^2 %.1f); prompt mean %.0f tokens (p50 %d, p99 %d), output mean %.0f (p50 %d, p99 %d); oracle prefix hit rate %.1f%%\n",
		d.Requests, d.Span.Round(time.Second), d.Rate, d.ArrivalCV2, d.PromptMean, d.PromptP50, d.PromptP99, d.OutputMean, d.OutputP50, d.OutputP99, 100*d.OracleHitRate)
	cost := ""
	if r.GPUCost > 0 {
		cost = fmt.Sprintf("; $%.2f per GPU-hour", r.GPUCost)
	}
	if d.Adapters > 0 {
		fmt.Fprintf(b, "  LoRA: %.1f%% of the requests name one of %s; engines batch at most %s a step (--max-loras %d)\n",
			100*d.AdapterRequests, plural(d.Adapters, "adapter"), plural(r.MaxLoRAs, "adapter"), r.MaxLoRAs)
	}
	fmt.Fprintf(b, "slo: %s; burst x%g%s\n", r.SLO, r.Burst, cost)
}

func (r *Result) writeText(b *strings.Builder, md bool) {
	r.header(b)
	if r.Error != "" {
		fmt.Fprintf(b, "no plan: %s\n", r.Error)
		if r.Bounds.Compute.Name == "" {
			return
		}
	}
	bd := r.Bounds
	fmt.Fprintf(b, "\nclosed-form bounds (engine cost model, before any simulation):\n")
	for _, x := range []Bound{bd.Compute, bd.Memory, bd.Bandwidth} {
		fmt.Fprintf(b, "  %-9s >= %5.2f engines -> %d\n      %s\n", x.Name, x.Engines, x.Need, x.Explain)
	}
	for _, x := range []*Bound{bd.Slots, bd.DecodeSlots} {
		switch {
		case x == nil:
		case x.Need == 0:
			fmt.Fprintf(b, "  %-9s    none\n      %s\n", x.Name, x.Explain)
		default:
			fmt.Fprintf(b, "  %-9s >= %5.2f engines -> %d\n      %s\n", x.Name, x.Engines, x.Need, x.Explain)
		}
	}
	// A floor is computed only for a target the SLO sets: no "TPOT 0".
	var floors []string
	if r.SLO.TTFT.Set() {
		floors = append(floors, "TTFT at the SLO quantile "+fmtDur(bd.TTFTFloor))
	}
	if r.SLO.TPOT.Set() {
		floors = append(floors, "TPOT "+fmtDur(bd.TPOTFloor)+" (one sequence at that context)")
	}
	if len(floors) > 0 {
		fmt.Fprintf(b, "  latency floors on an idle engine, every shared prefix cached: %s\n", strings.Join(floors, ", "))
	}
	if bd.Slots != nil {
		fmt.Fprintf(b, "  aggregated search starts at max(compute, memory, slots) = %d engines\n", bd.Aggregated)
	} else {
		fmt.Fprintf(b, "  aggregated search starts at max(compute, memory) = %d engines\n", bd.Aggregated)
	}

	fmt.Fprintf(b, "\nsimulated: %s\n", r.Simulated)
	candTable(b, "aggregated search (search window, one seed):", r.Candidates, false)
	candTable(b, "disaggregated search (search window, one seed; split% = requests the router split between the pools):", r.PDCandidates, true)
	candTable(b, "confirming runs (the chosen fleets with every seed, one engine fewer, the burst):", r.Confirmations, true)

	fmt.Fprintf(b, "\nplan (simulated fleets: mean over the confirming seeds; model columns: queueing on the cost model):\n")
	a, m, dd, dm := &r.Aggregated, &r.AggregatedModel, &r.Disaggregated, &r.DisaggregatedModel
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\taggregated\taggregated (model)\tdisaggregated\tdisaggregated (model)\t\n")
	// A column with no fleet (no size of it met the SLO within the
	// search) has only its method and verdict: no capacity, hit rate or
	// throughput of zero engines.
	row := func(name string, f func(*Fleet) string) {
		cell := func(x *Fleet) string {
			if x.Engines == 0 {
				return "-"
			}
			return f(x)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, cell(a), cell(m), cell(dd), cell(dm))
	}
	fmt.Fprintf(tw, "method\t%s\t%s\t%s\t%s\t\n", a.Method, m.Method, dd.Method, dm.Method)
	fmt.Fprintf(tw, "meets SLO\t%s\t%s\t%s\t%s\t\n", yes(a.Meets), yes(m.Meets), yes(dd.Meets), yes(dm.Meets))
	row("engines", func(f *Fleet) string { return fmt.Sprint(f.Engines) })
	row("prefill:decode", func(f *Fleet) string { return f.Ratio() })
	row("GPUs", func(f *Fleet) string { return fmt.Sprint(f.GPUs) })
	if r.GPUCost > 0 {
		row("cost per hour", func(f *Fleet) string { return fmt.Sprintf("$%.2f", f.CostPerHour) })
	}
	row("KV capacity / engine", func(f *Fleet) string { return fmt.Sprintf("%d tokens", f.KVCapacityTokens) })
	row("prefix hit rate", func(f *Fleet) string { return fmt.Sprintf("%.1f%%", 100*f.HitRate) })
	row("TTFT p50/p90/p99", func(f *Fleet) string { return lat3(f.TTFT) })
	row("TPOT p50/p90/p99", func(f *Fleet) string { return lat3(f.TPOT) })
	row("throughput", func(f *Fleet) string { return fmt.Sprintf("%.2f req/s, %.0f tok/s", f.ThroughputRPS, f.OutputTPS) })
	row("spread over seeds", func(f *Fleet) string {
		sp := f.Spread
		if sp == nil {
			return "-"
		}
		return fmt.Sprintf("ttft p90 %s..%s, p99 %s..%s; %.2f..%.2f req/s (seeds %v)", fmtLat(sp.TTFTP90[0]), fmtLat(sp.TTFTP90[1]),
			fmtLat(sp.TTFTP99[0]), fmtLat(sp.TTFTP99[1]), sp.ThroughputRPS[0], sp.ThroughputRPS[1], sp.Seeds)
	})
	row("utilisation", func(f *Fleet) string {
		if f.Prefill > 0 {
			return fmt.Sprintf("%.0f%% (prefill %.0f%%, decode %.0f%%)", 100*f.Utilisation, 100*f.PrefillUtil, 100*f.DecodeUtil)
		}
		return fmt.Sprintf("%.0f%%", 100*f.Utilisation)
	})
	row("decode batch / engine", func(f *Fleet) string { return fmt.Sprintf("%.1f", f.DecodeBatch) })
	row("requests split P/D", func(f *Fleet) string {
		if f.Prefill == 0 {
			return "-"
		}
		if f.Method != "simulated" {
			return fmt.Sprintf("%.1f%% expected (%s mode)", 100*f.SplitFraction, r.PDMode)
		}
		return fmt.Sprintf("%.1f%% (%s mode)", 100*f.SplitFraction, r.PDMode)
	})
	row("fabric total", func(f *Fleet) string {
		if f.Fabric == nil {
			return "-"
		}
		return fmtBytes(f.Fabric.Total) + "/s"
	})
	row("fabric / decode node", func(f *Fleet) string {
		if f.Fabric == nil {
			return "-"
		}
		return fmt.Sprintf("mean %s/s, p99 %s/s (%.0f%% of %g Gbps), max %s/s", fmtBytes(f.Fabric.PerDecodeMean), fmtBytes(f.Fabric.PerDecodeP99),
			100*f.Fabric.LinkUtilP99, f.Fabric.Gbps, fmtBytes(f.Fabric.PerDecodeMax))
	})
	row("KV handoff p50/p99", func(f *Fleet) string {
		if f.Fabric == nil {
			return "-"
		}
		s := fmtDur(f.Fabric.TransferP50) + " / " + fmtDur(f.Fabric.TransferP99)
		if f.Fabric.QueueP99 > 0 {
			s += " (queue p99 " + fmtDur(f.Fabric.QueueP99) + ")"
		}
		return s
	})
	row(fmt.Sprintf("burst x%g", r.Burst), func(f *Fleet) string { return headroom(f.Burst, r.SLO) })
	row("one node lost", func(f *Fleet) string { return headroom(f.NodeLost, r.SLO) })
	tw.Flush()
	switch r.Cheapest {
	case "aggregated":
		fmt.Fprintf(b, "cheapest: aggregated, %s (%s, %s; disaggregated needs %s)\n", plural(a.Engines, "engine"), plural(a.GPUs, "GPU"), a.Method, gpusOr(dd))
	case "disaggregated":
		fmt.Fprintf(b, "cheapest: disaggregated, %s prefill:decode (%s, %s; aggregated needs %s)\n", dd.Ratio(), plural(dd.GPUs, "GPU"), dd.Method, gpusOr(a))
	default:
		fmt.Fprintf(b, "no fleet meets the SLO\n")
	}
	if len(r.Demand.HotPrefixes) > 0 {
		fmt.Fprintf(b, "\nhot prefixes (locality headroom: engines that must hold each prefix so none serves it above %s utilisation):\n", "the target")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rank\trequests\tshare%\ttokens\tload (engines)\tcopies\tKV for copies\t")
		for _, h := range r.Demand.HotPrefixes {
			fmt.Fprintf(tw, "%d\t%d\t%.1f\t%d\t%.2f\t%d\t%d tokens\t\n", h.Rank, h.Requests, 100*h.Share, h.Tokens, h.Load, h.Copies, h.Copies*h.Tokens)
		}
		tw.Flush()
	}
	var notes []string
	notes = append(notes, r.Notes...)
	for _, f := range []*Fleet{a, m, dd, dm} {
		for _, n := range f.Notes {
			notes = append(notes, f.Mode+" ("+f.Method+"): "+n)
		}
	}
	r.writeVerification(b)
	if len(notes) > 0 {
		fmt.Fprintf(b, "\nnotes:\n")
		for _, n := range notes {
			fmt.Fprintf(b, "  - %s\n", n)
		}
	}
}

// writeVerification prints the verification table (Result.Verify), if any.
func (r *Result) writeVerification(b *strings.Builder) {
	v := r.Verify
	if v == nil {
		return
	}
	fmt.Fprintf(b, "\nverification: the whole workload (%d requests) on each planned fleet with seed %d, which the plan did not use:\n", v.Requests, v.Seed)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The SLO's own quantile gets a column unless it is p90 or p99,
	// which have theirs.
	q := qName(atQ(r.SLO.TTFT))
	atSLO := func(s string) string { return s + "\t" }
	if q == "90" || q == "99" {
		q, atSLO = "", func(string) string { return "" }
	}
	head := "fleet\t\tttft p90\tttft p99\t"
	if q != "" {
		head += "ttft p" + q + "\t"
	}
	fmt.Fprintln(tw, head+"req/s\thit%\tmeets\t")
	for _, x := range []struct {
		name string
		c    *Check
	}{{"aggregated", v.Aggregated}, {"disaggregated", v.Disaggregated}} {
		c := x.c
		if c == nil {
			continue
		}
		fmt.Fprintf(tw, "%s %s\tpredicted\t%s\t%s\t%s%.3f\t\t\t\n", x.name, c.Fleet, fmtLat(c.PredictedTTFT.P90), fmtLat(c.PredictedTTFT.P99),
			atSLO(fmtLat(atOr99(c.PredictedTTFT, r.SLO.TTFT))), c.PredictedThroughputRPS)
		fmt.Fprintf(tw, "\tsimulated\t%s\t%s\t%s%.3f\t%.1f\t%s\t\n", fmtLat(c.TTFT.P90), fmtLat(c.TTFT.P99),
			atSLO(fmtLat(atOr99(c.TTFT, r.SLO.TTFT))), c.ThroughputRPS, 100*c.HitRate, yes(c.Meets))
		fmt.Fprintf(tw, "\tdifference\t%s\t%s\t%s%s\t\t\t\n", pct(c.TTFTP90Error), pct(c.TTFTP99Error), atSLO(pct(c.TTFTError)), pct(c.ThroughputError))
	}
	tw.Flush()
}

// candTable prints simulation runs; pd adds the pools' columns.
func candTable(b *strings.Builder, title string, cs []Candidate, pd bool) {
	if len(cs) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s\n", title)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	h := "engines\t"
	if pd {
		h += "P:D\tseed\trate\t"
	}
	h += "ttft50\tttft90\tttft99\ttpot50\ttpot99\tattain%\thit%\tutil%\t"
	if pd {
		h += "split%\tfabric/node p99\t"
	}
	fmt.Fprintln(tw, h+"preempt\tfailed\tmeets\t")
	for _, c := range cs {
		fmt.Fprintf(tw, "%d\t", c.Engines)
		if pd {
			ratio := "-"
			if c.Prefill > 0 {
				ratio = fmt.Sprintf("%d:%d", c.Prefill, c.Decode)
			}
			fmt.Fprintf(tw, "%s\t%d\tx%g\t", ratio, c.Seed, c.Scale)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%.0f\t", fmtLat(c.TTFT.P50), fmtLat(c.TTFT.P90), fmtLat(c.TTFT.P99),
			fmtLat(c.TPOT.P50), fmtLat(c.TPOT.P99), 100*c.Attainment, 100*c.HitRate, 100*c.Utilisation)
		if pd {
			fab, split := "-", "-"
			if c.Fabric != nil {
				fab = fmtBytes(c.Fabric.PerDecodeP99) + "/s"
			}
			if c.Prefill > 0 {
				split = fmt.Sprintf("%.1f", 100*c.Disaggregated)
			}
			fmt.Fprintf(tw, "%s\t%s\t", split, fab)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t\n", c.Preemptions, c.Failed, yes(c.Meets))
	}
	tw.Flush()
}

func pct(x float64) string {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", 100*x)
}

// atQ is the target's quantile, 0.99 without a target.
func atQ(t Target) float64 {
	if t.Set() {
		return t.Quantile
	}
	return 0.99
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}

func lat3(l Latency) string {
	if l.P99 == 0 && l.P50 == 0 {
		return "-"
	}
	return fmtLat(l.P50) + " / " + fmtLat(l.P90) + " / " + fmtLat(l.P99)
}

func fmtLat(d time.Duration) string {
	if d == infDur {
		return "saturated"
	}
	return fmtDur(d)
}

func headroom(h *Headroom, slo SLO) string {
	if h == nil {
		return "-"
	}
	if h.Engines == 0 {
		return h.Note
	}
	s := fmt.Sprintf("%d engines: ttft %s, tpot %s, util %.0f%%, meets %s", h.Engines,
		fmtLat(atOr99(h.TTFT, slo.TTFT)), fmtLat(atOr99(h.TPOT, slo.TPOT)), 100*h.Utilisation, yes(h.Meets))
	if h.Note != "" {
		s += " (" + h.Note + ")"
	}
	return s
}

func atOr99(l Latency, t Target) time.Duration {
	if t.Set() {
		return l.AtSLO
	}
	return l.P99
}

// WriteMarkdown writes the plan as a markdown report: the reasoning, the
// tables and links to the charts WriteDir writes next to it.
func (r *Result) WriteMarkdown(w io.Writer, charts []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Capacity plan: %s (%s)\n\n", r.Profile, r.Name)
	fmt.Fprintf(&b, "Method: closed-form bounds from the engine cost model first (compute, memory, fabric bandwidth), then a search over aggregated fleet sizes and prefill:decode fleets with the fleet simulator (the router's own policy and P/D placement code, KV handoffs over a modelled fabric), starting at the bound and at the analytical P:D estimate, on a window of the workload; the chosen fleets are then confirmed on the whole workload with several seeds (the figures are their mean, with the spread). The analytical model columns are shown next to the simulated ones.\n\n")
	b.WriteString("```\n")
	r.writeText(&b, true)
	b.WriteString("```\n")
	for _, c := range charts {
		fmt.Fprintf(&b, "\n![%s](%s)\n", c, c)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Charts returns the plan's SVG charts by file name: SLO attainment (the
// fraction of requests within each limit, against the target quantile) and
// the TTFT and TPOT at the SLO quantiles (log scale, against the limits),
// both against the simulated aggregated fleet size.
func (r *Result) Charts() map[string]string {
	if len(r.Candidates) == 0 {
		return nil
	}
	var xs []float64
	var attT, attP, ttft, tpot []float64
	sec := func(d time.Duration) float64 {
		if d == infDur || d <= 0 {
			return math.NaN()
		}
		return d.Seconds()
	}
	for _, c := range r.Candidates {
		xs = append(xs, float64(c.Engines))
		attT = append(attT, 100*c.TTFTAttainment)
		attP = append(attP, 100*c.TPOTAttainment)
		ttft = append(ttft, sec(atOr99(c.TTFT, r.SLO.TTFT)))
		tpot = append(tpot, sec(atOr99(c.TPOT, r.SLO.TPOT)))
	}
	att := chart{title: "SLO attainment against fleet size (" + r.Name + ")", xLabel: "aggregated engines (simulated)",
		yLabel: "% of requests within the limit", xs: xs, yMin: 0, yMax: 100}
	lat := chart{title: "Latency at the SLO quantile against fleet size (" + r.Name + ")", xLabel: "aggregated engines (simulated)",
		yLabel: "seconds (log scale)", xs: xs, log: true}
	if r.SLO.TTFT.Set() {
		att.series = append(att.series, series{"TTFT within " + fmtDur(r.SLO.TTFT.Limit), attT})
		att.refs = append(att.refs, ref{"TTFT target p" + qName(r.SLO.TTFT.Quantile), 100 * r.SLO.TTFT.Quantile})
		lat.series = append(lat.series, series{"TTFT p" + qName(r.SLO.TTFT.Quantile), ttft})
		lat.refs = append(lat.refs, ref{"TTFT limit " + fmtDur(r.SLO.TTFT.Limit), r.SLO.TTFT.Limit.Seconds()})
	}
	if r.SLO.TPOT.Set() {
		att.series = append(att.series, series{"TPOT within " + fmtDur(r.SLO.TPOT.Limit), attP})
		att.refs = append(att.refs, ref{"TPOT target p" + qName(r.SLO.TPOT.Quantile), 100 * r.SLO.TPOT.Quantile})
		lat.series = append(lat.series, series{"TPOT p" + qName(r.SLO.TPOT.Quantile), tpot})
		lat.refs = append(lat.refs, ref{"TPOT limit " + fmtDur(r.SLO.TPOT.Limit), r.SLO.TPOT.Limit.Seconds()})
	}
	return map[string]string{"attainment.svg": att.svg(), "latency.svg": lat.svg()}
}

// WriteHTML writes a self-contained HTML report (inline SVG, no scripts).
func (r *Result) WriteHTML(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>kvroute plan: %s</title></head><body style=\"font-family:sans-serif;max-width:1100px;margin:auto\">\n", html.EscapeString(r.Profile))
	fmt.Fprintf(&b, "<h1>Capacity plan: %s (%s)</h1>\n", html.EscapeString(r.Profile), html.EscapeString(r.Name))
	b.WriteString("<p>Closed-form bounds from the engine cost model first (compute, memory, fabric bandwidth), then a search over aggregated fleet sizes and prefill:decode fleets with the fleet simulator (the router's own policy and P/D placement code, KV handoffs over a modelled fabric), starting at the bound and at the analytical P:D estimate, on a window of the workload; the chosen fleets are then confirmed on the whole workload with several seeds (the figures are their mean, with the spread). The analytical model columns are shown next to the simulated ones.</p>\n<pre>")
	var t strings.Builder
	r.writeText(&t, false)
	b.WriteString(html.EscapeString(t.String()))
	b.WriteString("</pre>\n")
	charts := r.Charts()
	for _, name := range []string{"attainment.svg", "latency.svg"} {
		if svg, ok := charts[name]; ok {
			b.WriteString(svg + "\n")
		}
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteDir writes plan.json, plan.txt, plan.md, plan.html and the SVG charts
// into dir (created if needed) and returns the paths written.
func (r *Result) WriteDir(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("planner: write dir: %w", err)
	}
	var paths []string
	write := func(name string, f func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		fh, err := os.Create(p)
		if err != nil {
			return fmt.Errorf("planner: write dir: %w", err)
		}
		if err := f(fh); err != nil {
			fh.Close()
			return fmt.Errorf("planner: write %s: %w", p, err)
		}
		if err := fh.Close(); err != nil {
			return fmt.Errorf("planner: write %s: %w", p, err)
		}
		paths = append(paths, p)
		return nil
	}
	charts := r.Charts()
	var names []string
	for _, n := range []string{"attainment.svg", "latency.svg"} {
		if svg, ok := charts[n]; ok {
			names = append(names, n)
			if err := write(n, func(w io.Writer) error { _, err := io.WriteString(w, svg); return err }); err != nil {
				return paths, err
			}
		}
	}
	for _, x := range []struct {
		name string
		f    func(io.Writer) error
	}{
		{"plan.json", r.WriteJSON},
		{"plan.txt", r.WriteTable},
		{"plan.md", func(w io.Writer) error { return r.WriteMarkdown(w, names) }},
		{"plan.html", r.WriteHTML},
	} {
		if err := write(x.name, x.f); err != nil {
			return paths, err
		}
	}
	return paths, nil
}

type series struct {
	name string
	ys   []float64
}

type ref struct {
	name string
	y    float64
}

// chart is a small line chart: series over shared x values, dashed
// reference lines, an optional log y axis and a legend.
type chart struct {
	title, xLabel, yLabel string
	xs                    []float64
	series                []series
	refs                  []ref
	log                   bool
	yMin, yMax            float64 // fixed range when yMax > yMin
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}

func (c chart) svg() string {
	const W, H, ml, mr, mt, mb = 680, 380, 70, 20, 40, 70
	pw, ph := float64(W-ml-mr), float64(H-mt-mb)
	xlo, xhi := math.Inf(1), math.Inf(-1)
	for _, x := range c.xs {
		xlo, xhi = math.Min(xlo, x), math.Max(xhi, x)
	}
	if xhi <= xlo {
		xlo, xhi = xlo-1, xhi+1
	}
	tr := func(v float64) float64 {
		if c.log {
			return math.Log10(v)
		}
		return v
	}
	ylo, yhi := c.yMin, c.yMax
	if yhi <= ylo {
		ylo, yhi = math.Inf(1), math.Inf(-1)
		for _, s := range c.series {
			for _, y := range s.ys {
				if !math.IsNaN(y) && (!c.log || y > 0) {
					ylo, yhi = math.Min(ylo, tr(y)), math.Max(yhi, tr(y))
				}
			}
		}
		for _, r := range c.refs {
			ylo, yhi = math.Min(ylo, tr(r.y)), math.Max(yhi, tr(r.y))
		}
		if math.IsInf(ylo, 1) {
			ylo, yhi = 0, 1
		}
		if c.log {
			ylo, yhi = math.Floor(ylo), math.Ceil(yhi)
		} else {
			ylo = math.Min(0, ylo)
		}
		if yhi <= ylo {
			yhi = ylo + 1
		}
	}
	px := func(x float64) float64 { return ml + (x-xlo)/(xhi-xlo)*pw }
	py := func(y float64) float64 {
		v := math.Max(ylo, math.Min(yhi, tr(y)))
		return mt + ph - (v-ylo)/(yhi-ylo)*ph
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="20" text-anchor="middle" font-size="14">%s</text>`+"\n", W/2, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", ml, mt+ph, ml+pw, mt+ph)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="black"/>`+"\n", ml, mt, ml, mt+ph)
	if c.log {
		for e := ylo; e <= yhi; e++ {
			y := mt + ph - (e-ylo)/(yhi-ylo)*ph
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", ml-6, y+4, tick(math.Pow(10, e)))
		}
	} else {
		for i := 0; i <= 4; i++ {
			v := ylo + (yhi-ylo)*float64(i)/4
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", ml-6, py(v)+4, tick(math.Round(v*10)/10))
		}
	}
	for _, x := range c.xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), mt+ph+16, tick(x))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", ml+pw/2, mt+ph+34, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text x="14" y="%.1f" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>`+"\n", mt+ph/2, mt+ph/2, html.EscapeString(c.yLabel))
	legend := 0
	for i, r := range c.refs {
		col := palette[i%len(palette)]
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>`+"\n", ml, py(r.y), ml+pw, py(r.y), col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="%s">- - %s</text>`+"\n", float64(ml)+float64(legend)*150, H-8, col, html.EscapeString(r.name))
		legend++
	}
	for i, s := range c.series {
		col := palette[i%len(palette)]
		var pts []string
		for k := range c.xs {
			if k >= len(s.ys) || math.IsNaN(s.ys[k]) || (c.log && s.ys[k] <= 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(c.xs[k]), py(s.ys[k])))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(c.xs[k]), py(s.ys[k]), col)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="%s">— %s</text>`+"\n", float64(ml)+float64(legend)*150, H-8, col, html.EscapeString(s.name))
		legend++
	}
	b.WriteString("</svg>")
	return b.String()
}

func tick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e6 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func gpusOr(f *Fleet) string {
	if !f.Meets {
		return "no fleet that meets the SLO"
	}
	return plural(f.GPUs, "GPU") + ", " + f.Method
}

// plural writes n and the noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
