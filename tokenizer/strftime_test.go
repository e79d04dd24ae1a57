package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// strftimeCases: Python's datetime.strftime of naive datetimes (what
// transformers' strftime_now formats) on glibc, CPython 3.11, for each of
// strftimeFormats.
var strftimeCases = []struct {
	now  string
	want []string
}{
	{"2024-09-05T13:04:05.123456", []string{"05 Sep 2024", "September 05, 2024", "2024-09-05", "Thursday Thu 249 24 20", "13:04:05 01 PM  1 13", " 5|5| 9|05", "Thu Sep  5 13:04:05 2024", "09/05/24 13:04:05 09/05/24 2024-09-05 13:04:05 13:04", "123456", "|", "35 36 36 2024 24 4 4", "100% %Q %", "%-", "Jan 1 Mon PM MST 2006 05", "Sep pm \n\t"}},
	{"2023-01-01T00:00:07", []string{"01 Jan 2023", "January 01, 2023", "2023-01-01", "Sunday Sun 001 23 20", "00:00:07 12 AM 12  0", " 1|1| 1|01", "Sun Jan  1 00:00:07 2023", "01/01/23 00:00:07 01/01/23 2023-01-01 00:00:07 00:00", "000000", "|", "01 00 52 2022 22 7 0", "100% %Q %", "%-", "Jan 1 Mon PM MST 2006 01", "Jan am \n\t"}},
	{"2020-12-31T12:30:00", []string{"31 Dec 2020", "December 31, 2020", "2020-12-31", "Thursday Thu 366 20 20", "12:30:00 12 PM 12 12", "31|31|12|31", "Thu Dec 31 12:30:00 2020", "12/31/20 12:30:00 12/31/20 2020-12-31 12:30:00 12:30", "000000", "|", "52 52 53 2020 20 4 4", "100% %Q %", "%-", "Jan 1 Mon PM MST 2006 31", "Dec pm \n\t"}},
	{"2021-01-03T23:59:59", []string{"03 Jan 2021", "January 03, 2021", "2021-01-03", "Sunday Sun 003 21 20", "23:59:59 11 PM 11 23", " 3|3| 1|03", "Sun Jan  3 23:59:59 2021", "01/03/21 23:59:59 01/03/21 2021-01-03 23:59:59 23:59", "000000", "|", "01 00 53 2020 20 7 0", "100% %Q %", "%-", "Jan 1 Mon PM MST 2006 03", "Jan pm \n\t"}},
}
var strftimeFormats = []string{"%d %b %Y", "%B %d, %Y", "%Y-%m-%d", "%A %a %j %y %C", "%H:%M:%S %I %p %l %k", "%e|%-d|%_m|%0e", "%c", "%x %X %D %F %T %R", "%f", "%z%Z|", "%U %W %V %G %g %u %w", "100%% %Q %", "%-", "Jan 1 Mon PM MST 2006 %d", "%h %P %n%t"}

// TestPyStrftime: pyStrftime formats as Python does, literal text that
// spells a Go layout element and the directives the Go engine's
// strftime_now writes as they are (%y, %j, %e, %-d) included.
func TestPyStrftime(t *testing.T) {
	for _, c := range strftimeCases {
		now, err := time.Parse("2006-01-02T15:04:05.999999", c.now)
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range strftimeFormats {
			if got := pyStrftime(now, f); got != c.want[i] {
				t.Errorf("%s: strftime(%q) = %q, want Python's %q", c.now, f, got, c.want[i])
			}
		}
	}
}

// TestChatTemplateStrftimeNow: a template's strftime_now formats
// ChatOptions.Now, or the time of the render when it is zero, as
// transformers' datetime.now(); a date_string variable (vLLM's
// chat_template_kwargs) wins in Llama 3.x's templates, which take it
// first.
func TestChatTemplateStrftimeNow(t *testing.T) {
	const src = `{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}` +
		`Today Date: {{ date_string }}|{{ strftime_now(format="%y %j (1)") }}`
	tmpl, err := NewChatTemplate(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	fixed := time.Date(2024, 9, 5, 13, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		opts ChatOptions
		want string
	}{
		{ChatOptions{Now: fixed}, "Today Date: 05 Sep 2024|24 249 (1)"},
		{ChatOptions{Now: fixed, JSONVars: map[string]json.RawMessage{"date_string": json.RawMessage(`"26 Jul 2024"`)}}, "Today Date: 26 Jul 2024|24 249 (1)"},
	} {
		if got, err := tmpl.Render(nil, tc.opts); err != nil || got != tc.want {
			t.Errorf("Render(%+v) = %q, %v; want %q", tc.opts, got, err, tc.want)
		}
	}
	for range 2 { // a render across midnight: once more
		before := time.Now()
		got, err := tmpl.Render(nil, ChatOptions{})
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if before.YearDay() != after.YearDay() {
			continue
		}
		if want := "Today Date: " + pyStrftime(before, "%d %b %Y") + "|" + pyStrftime(before, "%y %j (1)"); got != want {
			t.Errorf("Render without Now = %q, want today's %q", got, want)
		}
		break
	}
}

// FuzzPyStrftime: any format (a chat template's) formats without a panic,
// its text outside directives is kept, and a format with no "%" is
// written as it is.
func FuzzPyStrftime(f *testing.F) {
	for _, s := range strftimeFormats {
		f.Add(s, int64(1725541445))
	}
	f.Add("%", int64(0))
	f.Add("%-%_%0", int64(-62135596800))
	f.Fuzz(func(t *testing.T, format string, unix int64) {
		now := time.Unix(unix%(1<<40), 0).UTC()
		got := pyStrftime(now, format)
		if !strings.Contains(format, "%") && got != format {
			t.Fatalf("pyStrftime(%q) = %q: a format without directives must be written as it is", format, got)
		}
		if again := pyStrftime(now, format); again != got {
			t.Fatalf("pyStrftime(%q) not deterministic: %q then %q", format, got, again)
		}
	})
}
