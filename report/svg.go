package report

import (
	"fmt"
	"html"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Chart is one rendered chart: Name is a file-name stem (e.g. ttft_cdf), SVG
// a standalone <svg> element with no external references.
type Chart struct {
	Name  string
	Title string
	SVG   string
}

// palette is a colour-blind-friendly set (Okabe-Ito plus greys).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999", "#8C564B"}

// lineChart is a multi-series line chart.
type lineChart struct {
	title, xLabel, yLabel string
	series                []Series
	yMin0                 bool // start the y axis at 0
	markers               bool // draw point markers
}

const (
	chartW, chartH                     = 760, 420
	marginL, marginR, marginT, marginB = 70, 190, 40, 50
)

// Charts returns the report's charts: the TTFT CDF per row (the highest
// load of each name in a sweep), p99 TTFT and goodput against load for
// sweeps, and one utilisation chart per Utilisation entry.
func (r *Report) Charts() []Chart {
	var out []Chart
	sweep := r.IsSweep()
	var cdf []Series
	for _, name := range r.names() {
		var pick *Row
		for i := range r.Rows {
			row := &r.Rows[i]
			if row.Name == name && len(row.TTFTQuantiles) > 0 && (pick == nil || row.Load >= pick.Load) {
				pick = row
			}
		}
		if pick == nil {
			continue
		}
		label := name
		if sweep {
			label = fmt.Sprintf("%s @%s", name, strconv.FormatFloat(pick.Load, 'g', 4, 64))
		}
		s := Series{Name: label}
		for q, v := range pick.TTFTQuantiles {
			s.X = append(s.X, v)
			s.Y = append(s.Y, float64(q)/float64(len(pick.TTFTQuantiles)-1))
		}
		cdf = append(cdf, s)
	}
	if len(cdf) > 0 {
		out = append(out, Chart{Name: "ttft_cdf", Title: "TTFT CDF",
			SVG: lineChart{title: "TTFT CDF", xLabel: "time to first token (s)", yLabel: "fraction of requests",
				series: cdf, yMin0: true}.render()})
	}
	if sweep {
		var p99s, good []Series
		for _, name := range r.names() {
			a, b := Series{Name: name}, Series{Name: name}
			for _, row := range r.Rows {
				if row.Name != name {
					continue
				}
				a.X, a.Y = append(a.X, row.Load), append(a.Y, row.TTFT.P99.Seconds())
				b.X, b.Y = append(b.X, row.Load), append(b.Y, row.Goodput)
			}
			p99s, good = append(p99s, a), append(good, b)
		}
		out = append(out,
			Chart{Name: "ttft_p99_vs_load", Title: "p99 TTFT against load",
				SVG: lineChart{title: "p99 TTFT against load", xLabel: "load", yLabel: "p99 TTFT (s)",
					series: p99s, yMin0: true, markers: true}.render()},
			Chart{Name: "goodput_vs_load", Title: "Goodput against load",
				SVG: lineChart{title: "Goodput (" + r.SLO.String() + ") against load", xLabel: "load",
					yLabel: "goodput (req/s)", series: good, yMin0: true, markers: true}.render()})
	}
	for i, u := range r.Utilisation {
		if len(u.Engines) == 0 {
			continue
		}
		title := "Per-engine " + orDefault(u.Metric, "utilisation") + " over time"
		if u.Run != "" {
			title += ": " + u.Run
		}
		out = append(out, Chart{Name: fmt.Sprintf("utilisation_%d_%s", i, fileSafe(u.Run)), Title: title,
			SVG: lineChart{title: title, xLabel: "time (s)", yLabel: orDefault(u.Metric, "utilisation"),
				series: u.Engines, yMin0: true}.render()})
	}
	return out
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func fileSafe(s string) string {
	s = unsafeChars.ReplaceAllString(s, "_")
	if s == "" {
		return "run"
	}
	return s
}

// escape makes s safe as XML text or an attribute value: characters XML
// does not allow (control characters other than tab, newline and carriage
// return, U+FFFE, U+FFFF, bytes that are not UTF-8) become U+FFFD, then
// markup is escaped. A standalone .svg file is read as XML: one such
// character in a name and no browser opens it.
func escape(s string) string {
	return html.EscapeString(strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return r
		case r < 0x20, r == 0xFFFE, r == 0xFFFF:
			return utf8.RuneError
		}
		return r // strings.Map turns bytes that are not UTF-8 into U+FFFD
	}, s))
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (c lineChart) render() string {
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for i := range min(len(s.X), len(s.Y)) {
			if !finite(s.X[i]) || !finite(s.Y[i]) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if c.yMin0 && ymin > 0 {
		ymin = 0
	}
	xt := niceTicks(xmin, xmax, 6)
	yt := niceTicks(ymin, ymax, 5)
	xmin, xmax = xt[0], xt[len(xt)-1]
	ymin, ymax = yt[0], yt[len(yt)-1]
	pw, ph := float64(chartW-marginL-marginR), float64(chartH-marginT-marginB)
	px := func(x float64) float64 { return float64(marginL) + (x-xmin)/(xmax-xmin)*pw }
	py := func(y float64) float64 { return float64(marginT) + ph - (y-ymin)/(ymax-ymin)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", escape(c.title))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginL, escape(c.title))
	// Grid and ticks.
	for _, t := range xt {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e5e5"/>`, x, marginT, x, chartH-marginB)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, chartH-marginB+16, tickLabel(t))
	}
	for _, t := range yt {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>`, marginL, y, chartW-marginR, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y+4, tickLabel(t))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333333"/>`+"\n", marginL, marginT, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(marginL)+pw/2, chartH-10, escape(c.xLabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n",
		float64(marginT)+ph/2, float64(marginT)+ph/2, escape(c.yLabel))
	// Series.
	for i, s := range c.series {
		color := palette[i%len(palette)]
		var pts []string
		for j := range min(len(s.X), len(s.Y)) {
			if !finite(s.X[j]) || !finite(s.Y[j]) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[j]), py(s.Y[j])))
		}
		fmt.Fprintf(&b, `<g class="series" data-name="%s">`, escape(s.Name))
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		}
		if c.markers {
			for _, p := range pts {
				x, y, _ := strings.Cut(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, x, y, color)
			}
		}
		b.WriteString("</g>\n")
		// Legend.
		ly := marginT + 8 + i*18
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`, chartW-marginR+12, ly, chartW-marginR+32, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", chartW-marginR+38, ly+4, escape(truncate(s.Name, 24)))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// truncate cuts s to n characters, the last an ellipsis when it cut, on
// character boundaries (a cut inside a multi-byte character is not UTF-8,
// which no XML reader accepts).
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i, k := 0, 0
	for k < n-1 {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		k++
	}
	return s[:i] + "…"
}

// niceTicks returns evenly spaced round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi-lo < 1e-12 {
		if lo == 0 {
			hi = 1
		} else {
			lo, hi = lo-math.Abs(lo)*0.1, hi+math.Abs(hi)*0.1
		}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := math.Floor(lo/step) * step
	var out []float64
	for k := 0; k < 50; k++ {
		v := math.Round((start+float64(k)*step)/step) * step
		out = append(out, v)
		if v >= hi-step*1e-9 && k >= 1 {
			break
		}
	}
	return out
}

func tickLabel(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}
