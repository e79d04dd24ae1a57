package report

import (
	"fmt"
	"io"
	"strings"
)

// WriteHTML writes a self-contained HTML report: the settings, the table,
// errors by kind and every chart as inline SVG. It uses no script and no
// external stylesheet, font or image, so it works offline.
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	esc := escape
	title := r.Title
	if title == "" {
		title = "kvroute report"
	}
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n")
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(title))
	b.WriteString(`<style>
body{font-family:sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}
.chart{margin:16px 0}
</style>
</head>
<body>
`)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", esc(title))
	fmt.Fprintf(&b, "<p>source: %s · workload: %s · SLO: %s</p>\n", esc(orDash(r.Source)), esc(orDash(r.Workload)), esc(r.SLO.String()))
	if len(r.Params) > 0 {
		b.WriteString("<h2>Settings</h2>\n<table class=\"params\">\n")
		for _, k := range sortedKeys(r.Params) {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td></tr>\n", esc(k), esc(r.Params[k]))
		}
		b.WriteString("</table>\n")
	}
	b.WriteString("<h2>Results</h2>\n<table class=\"results\">\n<tr>")
	cols := r.columns()
	for _, c := range cols {
		fmt.Fprintf(&b, "<th>%s</th>", esc(c.head))
	}
	b.WriteString("</tr>\n")
	for i := range r.Rows {
		b.WriteString("<tr>")
		for _, c := range cols {
			fmt.Fprintf(&b, "<td>%s</td>", esc(c.text(&r.Rows[i])))
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")
	var errRows []string
	for i := range r.Rows {
		row := &r.Rows[i]
		for _, k := range sortedKeys(row.Errors) {
			errRows = append(errRows, fmt.Sprintf("<tr><td>%s</td><td>%g</td><td>%s</td><td>%d</td></tr>\n",
				esc(row.Name), row.Load, esc(k), row.Errors[k]))
		}
	}
	if len(errRows) > 0 {
		b.WriteString("<h2>Errors by kind</h2>\n<table class=\"errors\">\n<tr><th>name</th><th>load</th><th>kind</th><th>count</th></tr>\n")
		b.WriteString(strings.Join(errRows, ""))
		b.WriteString("</table>\n")
	}
	for i := range r.Rows {
		if row := &r.Rows[i]; row.Interrupted > 0 {
			fmt.Fprintf(&b, "<p class=\"interrupted\">%s (load %g): %s in flight cut short by the interruption, counted in none of reqs, ok, err, rej</p>\n",
				esc(row.Name), row.Load, requests(row.Interrupted))
		}
	}
	charts := r.Charts()
	if len(charts) > 0 {
		b.WriteString("<h2>Charts</h2>\n")
	}
	for _, c := range charts {
		fmt.Fprintf(&b, "<div class=\"chart\" id=\"%s\">\n%s</div>\n", esc(c.Name), c.SVG)
	}
	b.WriteString("</body>\n</html>\n")
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("report: write html: %w", err)
	}
	return nil
}
