package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute"
)

func TestWriteError(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantBody   string
	}{
		{"not found", kvroute.Errorf(404, kvroute.TypeNotFound, "model_not_found", "model", "model %q does not exist", "x"),
			404, `{"error":{"message":"model \"x\" does not exist","type":"not_found_error","param":"model","code":"model_not_found"}}`},
		{"wrapped", fmt.Errorf("route: %w", &kvroute.Error{Status: 503, Type: kvroute.TypeUnavailable, Message: "none healthy"}),
			503, `{"error":{"message":"none healthy","type":"service_unavailable_error","param":null,"code":503}}`},
		{"plain error", errors.New("boom"),
			500, `{"error":{"message":"boom","type":"internal_error","param":null,"code":"internal_error"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("Retry-After", "3")
			WriteError(rec, tc.err)
			if rec.Code != tc.wantStatus {
				t.Errorf("status: got %d, want %d", rec.Code, tc.wantStatus)
			}
			if got := rec.Body.String(); got != tc.wantBody+"\n" {
				t.Errorf("body:\n got %s\nwant %s", got, tc.wantBody)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type: got %q", ct)
			}
			if ra := rec.Header().Get("Retry-After"); ra != "3" {
				t.Errorf("Retry-After: got %q, want the header set before kept", ra)
			}
			var v ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Errorf("body is not JSON: %v", err)
			}
		})
	}
}

func TestAppendErrorEvent(t *testing.T) {
	err := &kvroute.Error{Status: http.StatusBadGateway, Type: kvroute.TypeUpstream, Message: "engine connection lost"}
	got := string(AppendErrorEvent(nil, err))
	want := `data: {"error":{"message":"engine connection lost","type":"upstream_error","param":null,"code":502}}` + "\n\ndata: [DONE]\n\n"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
