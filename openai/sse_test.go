package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestSSEWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewSSEWriter(rec)
	SetHeaders(rec.Header())
	w.Data([]byte(`{"a":1}`))
	w.AppendData(func(b []byte) []byte { return append(b, `{"b":2}`...) })
	w.Data([]byte("two\nlines"))
	w.Comment("keep-alive")
	if got := rec.Body.Len(); got != 0 {
		t.Fatalf("got %d bytes written before Flush, want 0", got)
	}
	w.Done()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: two\ndata: lines\n\n: keep-alive\n\ndata: [DONE]\n\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !rec.Flushed {
		t.Errorf("got Flushed false, want true")
	}
	if got, want := rec.Header().Get("Content-Type"), "text/event-stream; charset=utf-8"; got != want {
		t.Errorf("got content type %q, want %q", got, want)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestSSEWriterErrorSticky(t *testing.T) {
	w := NewSSEWriter(failWriter{})
	w.Done()
	if err := w.Flush(); err == nil {
		t.Fatal("got nil error, want broken pipe")
	}
	w.Done()
	if err := w.Flush(); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("got %v, want sticky broken pipe", err)
	}
}

type ev struct {
	Type, ID, Data string
	Retry          time.Duration
}

func readAll(r io.Reader, max int) ([]ev, error) {
	sr := NewSSEReader(r)
	sr.MaxEventBytes = max
	var out []ev
	for {
		e, err := sr.Next()
		if err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev{e.Type, e.ID, string(e.Data), e.Retry})
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []ev
	}{
		{"vllm stream", "data: {\"a\":1}\n\ndata: [DONE]\n\n", []ev{{Data: `{"a":1}`}, {Data: "[DONE]"}}},
		{"crlf", "data: x\r\n\r\ndata: y\r\n\r\n", []ev{{Data: "x"}, {Data: "y"}}},
		{"cr only", "data: x\r\rdata: y\r\r", []ev{{Data: "x"}, {Data: "y"}}},
		{"no space", "data:x\n\n", []ev{{Data: "x"}}},
		{"two spaces keep one", "data:  x\n\n", []ev{{Data: " x"}}},
		{"multi line", "data: a\ndata: b\n\n", []ev{{Data: "a\nb"}}},
		{"comments and unknown fields", ": ping\nfoo: bar\ndata: x\n\n", []ev{{Data: "x"}}},
		{"event id retry", "event: error\nid: 7\nretry: 1500\ndata: x\n\ndata: y\n\n",
			[]ev{{Type: "error", ID: "7", Data: "x", Retry: 1500 * time.Millisecond}, {ID: "7", Data: "y", Retry: 1500 * time.Millisecond}}},
		{"no final blank line", "data: a\n\ndata: b", []ev{{Data: "a"}, {Data: "b"}}},
		{"bom", "\xef\xbb\xbfdata: x\n\n", []ev{{Data: "x"}}},
		{"empty data line", "data\n\n", []ev{{Data: ""}}},
		{"event without data dropped", "event: x\n\ndata: y\n\n", []ev{{Data: "y"}}},
		// llama.cpp before PR 16109 (2025-09): the error is an event.
		{"llama.cpp error field", "error: {\"code\":400}\n\ndata: [DONE]\n\n", []ev{{Type: "error", Data: `{"code":400}`}, {Data: "[DONE]"}}},
		{"empty", "", nil},
		{"blank lines only", "\n\n\r\n", nil},
	}
	for _, tt := range tests {
		for _, mode := range []string{"whole", "byte"} {
			t.Run(tt.name+"/"+mode, func(t *testing.T) {
				var r io.Reader = strings.NewReader(tt.in)
				if mode == "byte" {
					r = iotest.OneByteReader(r)
				}
				got, err := readAll(r, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("got %+v, want %+v", got, tt.want)
				}
			})
		}
	}
}

func TestSSEReaderLongLine(t *testing.T) {
	long := strings.Repeat("x", 100000)
	got, err := readAll(iotest.HalfReader(strings.NewReader("data: "+long+"\n\n")), 0)
	if err != nil || len(got) != 1 || got[0].Data != long {
		t.Fatalf("got %d events, err %v; want one event of %d bytes", len(got), err, len(long))
	}
	_, err = readAll(strings.NewReader("data: "+long+"\n\n"), 1000)
	if !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("got %v, want ErrEventTooLarge", err)
	}
}

func TestSSEReaderBrokenStream(t *testing.T) {
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(io.ErrUnexpectedEOF))
	sr := NewSSEReader(r)
	var got []string
	var err error
	for {
		var e Event
		e, err = sr.Next()
		if err != nil {
			break
		}
		got = append(got, string(e.Data))
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("got error %v, want io.ErrUnexpectedEOF", err)
	}
	if want := []string{"a", "b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// writeThenRead writes a stream with write and ends it with [DONE]; it
// returns the events an SSEReader reads from it, and the stream.
func writeThenRead(t *testing.T, write func(w *SSEWriter)) ([]ev, string) {
	t.Helper()
	var buf bytes.Buffer
	w := NewSSEWriter(&buf)
	write(w)
	w.Done()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	stream := buf.String()
	got, err := readAll(&buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	return got, stream
}

func TestWriterReaderRoundTrip(t *testing.T) {
	h := &ChunkHeader{ID: "chatcmpl-1", Model: "m", Created: 1}
	got, _ := writeThenRead(t, func(w *SSEWriter) {
		w.AppendData(func(b []byte) []byte { return AppendChatRoleChunk(b, h, "assistant", nil, nil) })
		w.AppendData(func(b []byte) []byte { return AppendChatContentChunk(b, h, "a\nb", "", nil, nil, nil) })
	})
	if len(got) != 3 || got[1].Data != string(AppendChatContentChunk(nil, h, "a\nb", "", nil, nil, nil)) || got[2].Data != Done {
		t.Errorf("got %+v", got)
	}
}

// naiveEvents is a reference SSE parser written straight from the
// specification, on a whole string.
func naiveEvents(in string) []ev {
	in = strings.TrimPrefix(in, "\xef\xbb\xbf")
	in = strings.ReplaceAll(in, "\r\n", "\n")
	in = strings.ReplaceAll(in, "\r", "\n")
	lines := strings.Split(in, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	var out []ev
	var data []string
	has := false
	typ, id := "", ""
	var retry time.Duration
	for _, l := range append(lines, "") {
		if l == "" {
			if has {
				out = append(out, ev{typ, id, strings.Join(data, "\n"), retry})
			}
			data, has, typ = nil, false, ""
			continue
		}
		if l[0] == ':' {
			continue
		}
		f, v, _ := strings.Cut(l, ":")
		v = strings.TrimPrefix(v, " ")
		switch f {
		case "data":
			data, has = append(data, v), true
		case "error": // llama.cpp's old mid-stream error
			data, has, typ = append(data, v), true, "error"
		case "event":
			typ = v
		case "id":
			if !strings.Contains(v, "\x00") {
				id = v
			}
		case "retry":
			if ms, err := strconv.ParseUint(v, 10, 63); err == nil {
				retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
	return out
}

func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n", "data: x\r\n\r\n", "data:x\r\rdata: y", "\xef\xbb\xbfdata: z\n\n",
		"event: e\nid: 1\nretry: 10\ndata\n\n", ": c\n\n", "error: {}\n\n", "error:x\nevent: y\n", "data: a\ndata: b\n", "\r\n\r",
	} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
	}
	f.Fuzz(func(t *testing.T, in string, mode uint8) {
		var r io.Reader = strings.NewReader(in)
		switch mode % 3 {
		case 1:
			r = iotest.OneByteReader(r)
		case 2:
			r = iotest.HalfReader(r)
		}
		got, err := readAll(r, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := naiveEvents(in); !reflect.DeepEqual(got, want) {
			t.Errorf("input %q:\ngot  %+v\nwant %+v", in, got, want)
		}
	})
}

func BenchmarkSSEReader(b *testing.B) {
	b.ReportAllocs()
	h := &ChunkHeader{ID: NewChatID(), Model: "m", Created: 1}
	var buf bytes.Buffer
	w := NewSSEWriter(&buf)
	for range 100 {
		w.AppendData(func(d []byte) []byte { return AppendChatContentChunk(d, h, " token", "", nil, nil, nil) })
	}
	w.Done()
	_ = w.Flush()
	in := buf.Bytes()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sr := NewSSEReader(bytes.NewReader(in))
		for {
			if _, err := sr.Next(); err != nil {
				break
			}
		}
	}
}

func ExampleSSEReader() {
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
	r := NewSSEReader(strings.NewReader(stream))
	for {
		e, err := r.Next()
		if err != nil || e.IsDone() {
			break
		}
		fmt.Println(string(e.Data))
	}
	// Output: {"choices":[{"delta":{"content":"Hi"}}]}
}

func ExampleSSEWriter() {
	var out bytes.Buffer
	w := NewSSEWriter(&out)
	h := &ChunkHeader{ID: "chatcmpl-1", Model: "tiny", Created: 1700000000}
	w.AppendData(func(b []byte) []byte { return AppendChatRoleChunk(b, h, "assistant", nil, nil) })
	w.AppendData(func(b []byte) []byte { return AppendChatContentChunk(b, h, "Hello", FinishLength, nil, nil, nil) })
	w.Done()
	_ = w.Flush()
	fmt.Print(out.String())
	// Output:
	// data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}
	//
	// data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"tiny","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}
	//
	// data: [DONE]
}

// TestSSEWriterLineBreaks: Data and Comment split their text at every
// line break a reader sees (CR, LF and CRLF), so a payload holding a bare
// CR keeps the text after it and a comment cannot start an event.
func TestSSEWriterLineBreaks(t *testing.T) {
	payloads := []string{"a\rb", "a\r\nb", "a\nb", "a\r\rb\n", "\r", "x"}
	got, stream := writeThenRead(t, func(w *SSEWriter) {
		for _, p := range payloads {
			w.Data([]byte(p))
		}
		w.Comment("keep-alive\ndata: injected\r\rdata: too")
	})
	var want []ev
	for _, p := range payloads {
		p = strings.ReplaceAll(strings.ReplaceAll(p, "\r\n", "\n"), "\r", "\n")
		want = append(want, ev{Data: p})
	}
	want = append(want, ev{Data: Done})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stream %q read as\n got %+v\nwant %+v", stream, got, want)
	}
}

func TestIsPlainEventStream(t *testing.T) {
	for _, tc := range []struct {
		ct, ce string
		want   bool
	}{
		{"text/event-stream", "", true},
		{"text/event-stream; charset=utf-8", "", true},
		{" Text/Event-Stream ;charset=utf-8", "identity", true},
		{"text/event-stream", "gzip", false}, // events cannot be written inside the encoding
		{"text/event-stream", "br", false},
		{"application/json", "", false},
		{"text/event-streams", "", false},
		{"", "", false},
	} {
		h := http.Header{}
		if tc.ct != "" {
			h.Set("Content-Type", tc.ct)
		}
		if tc.ce != "" {
			h.Set("Content-Encoding", tc.ce)
		}
		if got := IsPlainEventStream(h); got != tc.want {
			t.Errorf("Content-Type %q, Content-Encoding %q: got %v, want %v", tc.ct, tc.ce, got, tc.want)
		}
	}
}
