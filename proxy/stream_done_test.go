package proxy

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestBreakAfterDoneIsNotAStreamError: an engine (or a hop before the
// router) that drops the connection after the final data: [DONE] ended a
// complete stream. The client gets the events as sent and one [DONE],
// nothing after it (an error event and a second [DONE] were appended), and
// the endpoint is not counted as failing.
func TestBreakAfterDoneIsNotAStreamError(t *testing.T) {
	be := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":0}\n\ndata: [DONE]\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	tp := newTestProxy(t, testConfig("first", be.URL))
	raw := readAll(t, tp.post(t, PathCompletions, streamBody))
	var got []string
	sc := bufio.NewScanner(strings.NewReader(raw))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			got = append(got, d)
		}
	}
	if len(got) != 2 || got[1] != "[DONE]" {
		t.Errorf("events: got %q, want the chunk and one [DONE]", got)
	}
	if v := tp.metric(t, tp.metrics.streamErrors, "m", be.URL); v != 0 {
		t.Errorf("kvroute_upstream_stream_errors_total: got %v, want 0", v)
	}
}
