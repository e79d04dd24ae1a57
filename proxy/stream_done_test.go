package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestBreakAfterDoneIsNotAStreamError: an engine (or a hop before the
// router) that drops the connection after the final data: [DONE] ended a
// complete stream. The client gets the events as sent and one [DONE],
// nothing after it (an error event and a second [DONE] were appended), and
// the endpoint is not counted as failing. The SSE format allows three line
// endings (LF, CRLF, CR): each ends the [DONE] event.
func TestBreakAfterDoneIsNotAStreamError(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		t.Run(fmt.Sprintf("%q", eol), func(t *testing.T) {
			be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
				flushEvents(w, "data: {\"n\":0}"+eol+eol+"data: [DONE]"+eol+eol)
				panic(http.ErrAbortHandler)
			})
			tp := newTestProxy(t, testConfig("first", be.URL))
			raw := readAll(t, tp.post(t, PathCompletions, streamBody))
			var got []string
			// The events as a client's SSE reader sees them: any line ending.
			for _, line := range strings.FieldsFunc(raw, func(r rune) bool { return r == '\n' || r == '\r' }) {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					got = append(got, d)
				}
			}
			if len(got) != 2 || got[1] != "[DONE]" {
				t.Errorf("events: got %q, want the chunk and one [DONE]", got)
			}
			if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 0 {
				t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 0", v)
			}
		})
	}
}
