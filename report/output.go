package report

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// column is one table/CSV column.
type column struct {
	head string                 // table header
	csv  string                 // CSV header
	text func(r *Row) string    // table cell
	val  func(r *Row) string    // CSV cell (machine-readable)
	show func(rep *Report) bool // nil = always
}

func durCol(head, csvName string, f func(r *Row) Dist, pick func(d Dist) time.Duration) column {
	return column{
		head: head, csv: csvName,
		text: func(r *Row) string {
			d := f(r)
			if d.N == 0 {
				return "-"
			}
			return FormatDuration(pick(d))
		},
		val: func(r *Row) string {
			d := f(r)
			if d.N == 0 {
				return ""
			}
			return strconv.FormatFloat(float64(pick(d))/1e6, 'f', 3, 64)
		},
	}
}

func numCol(head, csvName string, f func(r *Row) float64, prec int) column {
	return column{head: head, csv: csvName,
		text: func(r *Row) string { return strconv.FormatFloat(f(r), 'f', prec, 64) },
		val:  func(r *Row) string { return strconv.FormatFloat(f(r), 'f', -1, 64) },
	}
}

func intCol(head, csvName string, f func(r *Row) int) column {
	return column{head: head, csv: csvName,
		text: func(r *Row) string { return strconv.Itoa(f(r)) },
		val:  func(r *Row) string { return strconv.Itoa(f(r)) },
	}
}

// pctCol renders a fraction as a percentage, "-" when negative (unknown).
func pctCol(head, csvName string, f func(r *Row) float64) column {
	return column{head: head, csv: csvName,
		text: func(r *Row) string {
			if v := f(r); v >= 0 {
				return strconv.FormatFloat(100*v, 'f', 1, 64)
			}
			return "-"
		},
		val: func(r *Row) string {
			if v := f(r); v >= 0 {
				return strconv.FormatFloat(v, 'f', 4, 64)
			}
			return ""
		},
	}
}

var p50 = func(d Dist) time.Duration { return d.P50 }
var p90 = func(d Dist) time.Duration { return d.P90 }
var p99 = func(d Dist) time.Duration { return d.P99 }

var columns = []column{
	{head: "name", csv: "name", text: func(r *Row) string { return r.Name }, val: func(r *Row) string { return r.Name }},
	{head: "load", csv: "load", text: func(r *Row) string { return strconv.FormatFloat(r.Load, 'g', 4, 64) },
		val: func(r *Row) string { return strconv.FormatFloat(r.Load, 'f', -1, 64) }, show: (*Report).IsSweep},
	intCol("reqs", "requests", func(r *Row) int { return r.Requests }),
	intCol("ok", "completed", func(r *Row) int { return r.Completed }),
	intCol("err", "errors", (*Row).ErrorCount),
	intCol("rej", "rejected", func(r *Row) int { return r.Rejected }),
	durCol("ttft50", "ttft_p50_ms", func(r *Row) Dist { return r.TTFT }, p50),
	durCol("ttft90", "ttft_p90_ms", func(r *Row) Dist { return r.TTFT }, p90),
	durCol("ttft99", "ttft_p99_ms", func(r *Row) Dist { return r.TTFT }, p99),
	durCol("tpot50", "tpot_p50_ms", func(r *Row) Dist { return r.TPOT }, p50),
	durCol("tpot99", "tpot_p99_ms", func(r *Row) Dist { return r.TPOT }, p99),
	durCol("e2e50", "e2e_p50_ms", func(r *Row) Dist { return r.E2E }, p50),
	durCol("e2e99", "e2e_p99_ms", func(r *Row) Dist { return r.E2E }, p99),
	numCol("req/s", "throughput_rps", func(r *Row) float64 { return r.ThroughputRPS }, 2),
	numCol("tok/s", "output_tps", func(r *Row) float64 { return r.OutputTPS }, 0),
	numCol("good/s", "goodput_rps", func(r *Row) float64 { return r.Goodput }, 2),
	pctCol("good%", "goodput_frac", func(r *Row) float64 { return r.GoodputFrac }),
	pctCol("hit%", "hit_rate", func(r *Row) float64 { return r.HitRate }),
	pctCol("oracle%", "oracle_hit_rate", func(r *Row) float64 { return r.OracleHitRate }),
	{head: "imbal", csv: "imbalance",
		text: func(r *Row) string {
			if r.Imbalance < 0 {
				return "-"
			}
			return strconv.FormatFloat(r.Imbalance, 'f', 2, 64)
		},
		val: func(r *Row) string {
			if r.Imbalance < 0 {
				return ""
			}
			return strconv.FormatFloat(r.Imbalance, 'f', 4, 64)
		}},
	intCol("preempt", "preemptions", func(r *Row) int { return r.Preemptions }),
}

// FormatDuration renders a latency compactly: 0.42ms, 123.4ms, 1.23s, 512s.
func FormatDuration(d time.Duration) string {
	ms := float64(d) / 1e6
	switch {
	case d < 10*time.Millisecond:
		return strconv.FormatFloat(ms, 'f', 2, 64) + "ms"
	case d < time.Second:
		return strconv.FormatFloat(ms, 'f', 1, 64) + "ms"
	case d < 100*time.Second:
		return strconv.FormatFloat(ms/1000, 'f', 2, 64) + "s"
	}
	return strconv.FormatFloat(ms/1000, 'f', 0, 64) + "s"
}

func (r *Report) columns() []column {
	var out []column
	for _, c := range columns {
		if c.show == nil || c.show(r) {
			out = append(out, c)
		}
	}
	return out
}

// WriteTable writes the report as an aligned plain-text table: a title
// line, the SLO, one row per Row, then the errors by kind of rows that had
// any and the Interrupted requests of rows that had some.
func (r *Report) WriteTable(w io.Writer) error {
	cols := r.columns()
	cells := make([][]string, 0, len(r.Rows)+1)
	head := make([]string, len(cols))
	for i, c := range cols {
		head[i] = c.head
	}
	cells = append(cells, head)
	for i := range r.Rows {
		line := make([]string, len(cols))
		for j, c := range cols {
			line[j] = c.text(&r.Rows[i])
		}
		cells = append(cells, line)
	}
	// Widths are in characters (runes), not bytes: a multi-byte name
	// would otherwise be padded short.
	width := make([]int, len(cols))
	for _, line := range cells {
		for j, s := range line {
			width[j] = max(width[j], utf8.RuneCountInString(s))
		}
	}
	var b strings.Builder
	if r.Title != "" {
		fmt.Fprintf(&b, "%s\n", r.Title)
	}
	fmt.Fprintf(&b, "workload: %s   slo: %s\n", orDash(r.Workload), r.SLO)
	for _, line := range cells {
		for j, s := range line {
			if j > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[j]-utf8.RuneCountInString(s))
			if j == 0 {
				b.WriteString(s + pad)
			} else {
				b.WriteString(pad + s)
			}
		}
		b.WriteByte('\n')
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		if len(row.Errors) == 0 {
			continue
		}
		var parts []string
		for _, k := range sortedKeys(row.Errors) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, row.Errors[k]))
		}
		label := row.Name
		if r.IsSweep() {
			label += "@" + strconv.FormatFloat(row.Load, 'g', 4, 64)
		}
		fmt.Fprintf(&b, "errors %s: %s\n", label, strings.Join(parts, " "))
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Interrupted == 0 {
			continue
		}
		label := row.Name
		if r.IsSweep() {
			label += "@" + strconv.FormatFloat(row.Load, 'g', 4, 64)
		}
		fmt.Fprintf(&b, "interrupted %s: %s in flight cut short, counted in none of reqs, ok, err, rej\n", label, requests(row.Interrupted))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// requests writes n and "request", with an s unless n is 1.
func requests(n int) string {
	if n == 1 {
		return "1 request"
	}
	return strconv.Itoa(n) + " requests"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteCSV writes one header line and one line per row; durations are in
// milliseconds, rates as fractions, unknown values empty; a final column
// holds the errors as kind=count;kind=count.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	var head []string
	for _, c := range columns {
		head = append(head, c.csv)
	}
	head = append(head, "error_kinds")
	if err := cw.Write(head); err != nil {
		return fmt.Errorf("report: write csv: %w", err)
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		var line []string
		for _, c := range columns {
			line = append(line, c.val(row))
		}
		var parts []string
		for _, k := range sortedKeys(row.Errors) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, row.Errors[k]))
		}
		line = append(line, strings.Join(parts, ";"))
		if err := cw.Write(line); err != nil {
			return fmt.Errorf("report: write csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("report: write csv: %w", err)
	}
	return nil
}

// WriteJSON writes the report as indented JSON (durations in nanoseconds).
// Non-finite numbers are written as -1.
func (r *Report) WriteJSON(w io.Writer) error {
	c := r.sanitized()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return fmt.Errorf("report: write json: %w", err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON: one JSON object, nothing
// but white space after it.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	dec := json.NewDecoder(rd)
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("report: read json: %w", err)
	}
	// A second report (two files concatenated) or other text after it
	// would otherwise be dropped without a word.
	var syntax *json.SyntaxError
	switch _, err := dec.Token(); {
	case err == io.EOF:
	case err == nil || errors.As(err, &syntax):
		return nil, fmt.Errorf("report: read json: data after the report (offset %d)", dec.InputOffset())
	default:
		return nil, fmt.Errorf("report: read json: %w", err)
	}
	return &r, nil
}

// sanitized returns a copy whose floats are all finite (JSON cannot carry
// NaN or Inf).
func (r *Report) sanitized() *Report {
	c := *r
	c.Rows = make([]Row, len(r.Rows))
	fix := func(f *float64) {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = -1
		}
	}
	for i, row := range r.Rows {
		for _, f := range []*float64{&row.Load, &row.ThroughputRPS, &row.OutputTPS, &row.Goodput,
			&row.GoodputFrac, &row.HitRate, &row.OracleHitRate, &row.Imbalance} {
			fix(f)
		}
		if row.TTFTQuantiles != nil {
			q := make([]float64, len(row.TTFTQuantiles))
			copy(q, row.TTFTQuantiles)
			for j := range q {
				fix(&q[j])
			}
			row.TTFTQuantiles = q
		}
		c.Rows[i] = row
	}
	c.Utilisation = make([]Utilisation, len(r.Utilisation))
	for i, u := range r.Utilisation {
		u.Engines = append([]Series(nil), u.Engines...)
		for j, s := range u.Engines {
			x, y := append([]float64(nil), s.X...), append([]float64(nil), s.Y...)
			for k := range x {
				fix(&x[k])
			}
			for k := range y {
				fix(&y[k])
			}
			u.Engines[j] = Series{Name: s.Name, X: x, Y: y}
		}
		c.Utilisation[i] = u
	}
	if len(r.Utilisation) == 0 {
		c.Utilisation = nil
	}
	return &c
}

// WriteDir writes the report into dir (created if needed): report.json,
// report.csv, report.txt (the table), report.html and one .svg per chart.
// It returns the paths written.
func (r *Report) WriteDir(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var paths []string
	write := func(name string, f func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		fh, err := os.Create(p)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		if err := f(fh); err != nil {
			fh.Close()
			return err
		}
		if err := fh.Close(); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		paths = append(paths, p)
		return nil
	}
	for _, out := range []struct {
		name string
		f    func(io.Writer) error
	}{
		{"report.json", r.WriteJSON},
		{"report.csv", r.WriteCSV},
		{"report.txt", r.WriteTable},
		{"report.html", r.WriteHTML},
	} {
		if err := write(out.name, out.f); err != nil {
			return paths, err
		}
	}
	for _, c := range r.Charts() {
		if err := write(c.Name+".svg", func(w io.Writer) error {
			_, err := io.WriteString(w, svgHeader+c.SVG)
			return err
		}); err != nil {
			return paths, err
		}
	}
	return paths, nil
}

const svgHeader = `<?xml version="1.0" encoding="UTF-8"?>` + "\n"
