package kvroute

import (
	"slices"
	"strings"
	"testing"
)

type msg struct{ role, content string }

func canon(msgs ...msg) string {
	var b []byte
	for _, m := range msgs {
		b = AppendChatMessage(b, []byte(m.role), []byte(m.content))
	}
	return string(b)
}

func TestChatPromptRoundTrip(t *testing.T) {
	convs := [][]msg{
		{{"user", "hello"}},
		{{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello!"}},
		{{"user", ""}},
		{{"user", "a\x00b\x00\x00c\x01"}},
		{{"tool", "12:ab,\x00"}, {"user", "x"}},
	}
	for _, conv := range convs {
		p := canon(conv...)
		var got []msg
		if ok := ForEachChatMessage(p, func(r, c string) bool { got = append(got, msg{r, c}); return true }); !ok {
			t.Fatalf("%q: not recognised as canonical", p)
		}
		if len(got) != len(conv) {
			t.Fatalf("%q: got %d messages, want %d", p, len(got), len(conv))
		}
		for i := range conv {
			if got[i] != conv[i] {
				t.Fatalf("message %d: got %q, want %q", i, got[i], conv[i])
			}
		}
	}
}

func TestChatPromptSharesContentPrefixes(t *testing.T) {
	doc := strings.Repeat("A long shared document. ", 200)
	a := canon(msg{"user", doc + "question one?"})
	b := canon(msg{"user", doc + "another question"})
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	if common < len(doc) {
		t.Fatalf("shared canonical prefix: got %d bytes, want at least the %d-byte document", common, len(doc))
	}
	// A conversation is a prefix of its continuation.
	c1 := canon(msg{"user", "hi"}, msg{"assistant", "hello"})
	c2 := canon(msg{"user", "hi"}, msg{"assistant", "hello"}, msg{"user", "more"})
	if !strings.HasPrefix(c2, c1) {
		t.Fatal("conversation is not a prefix of its continuation")
	}
}

func TestChatPromptInjective(t *testing.T) {
	pairs := [][2][]msg{
		{{{"user", "ab"}}, {{"user", "a"}, {"user", "b"}}},
		{{{"user", "a\x00\x00"}}, {{"user", "a"}}},
		{{{"us", "er"}}, {{"u", "ser"}}},
	}
	for _, p := range pairs {
		if x, y := canon(p[0]...), canon(p[1]...); x == y {
			t.Fatalf("%v and %v share the canonical text %q", p[0], p[1], x)
		}
	}
	for _, bad := range []string{"plain text", "4:user,hello", "4:user,hi\x00\x02\x00\x00", "x:y,",
		"\x00\x03[]\x00\x00", "\x00\x03\x00\x004:user,hi\x00\x00", "\x00\x04[]\x00\x004:user,hi\x00\x00", "4:user,hi\x00\x02[1]\x00"} {
		if ForEachChatMessage(bad, func(string, string) bool { return true }) {
			t.Fatalf("%q recognised as canonical", bad)
		}
	}
}

// TestChatPromptTools: a request's tools and an assistant's tool calls
// are in the canonical text (different ones give different texts, a
// conversation stays a prefix of its continuation) and ForEachChatMessage
// skips them.
func TestChatPromptTools(t *testing.T) {
	tools := []byte(`[{"type":"function","function":{"name":"f"}}]`)
	call := func(b []byte, role, content, calls string) []byte {
		b = AppendChatRole(b, []byte(role))
		b = AppendChatContent(b, []byte(content))
		if calls != "" {
			b = AppendChatToolCalls(b, []byte(calls))
		}
		return append(b, ChatTerminator...)
	}
	conv := call(call(nil, "user", "hi\x00there", ""), "assistant", "", `[{"id":"c1"}]`)
	with := PrependChatTools(slices.Clone(conv), tools)
	cont := PrependChatTools(call(slices.Clone(conv), "tool", "42", ""), tools)
	if !strings.HasPrefix(string(cont), string(with)) {
		t.Errorf("%q is not a prefix of its continuation %q", with, cont)
	}
	other := PrependChatTools(slices.Clone(conv), []byte(`[{"type":"function","function":{"name":"g"}}]`))
	if string(other) == string(with) || string(conv) == string(with) {
		t.Errorf("tools not in the canonical text: %q", with)
	}
	var got []msg
	if !ForEachChatMessage(string(cont), func(r, c string) bool { got = append(got, msg{r, c}); return true }) {
		t.Fatalf("%q not recognised as canonical", cont)
	}
	want := []msg{{"user", "hi\x00there"}, {"assistant", ""}, {"tool", "42"}}
	if !slices.Equal(got, want) {
		t.Errorf("messages %q, want %q", got, want)
	}
}

func FuzzForEachChatMessage(f *testing.F) {
	f.Add("4:user,hello\x00\x00")
	f.Add("6:system,x\x00\x01y\x00\x004:user,z\x00\x00")
	f.Add("\x00\x03[1]\x00\x009:assistant,a\x00\x02[{}]\x00\x004:tool,1\x00\x00")
	f.Add("plain")
	f.Fuzz(func(t *testing.T, s string) {
		var msgs []msg
		var b []byte
		var tools string
		if !forEachChat(s, &tools, func(r, c, calls string) bool {
			msgs = append(msgs, msg{r, c})
			b = AppendChatContent(AppendChatRole(b, []byte(r)), []byte(c))
			if calls != "" {
				b = AppendChatToolCalls(b, []byte(calls))
			}
			b = append(b, ChatTerminator...)
			return true
		}) {
			return
		}
		if tools != "" {
			b = PrependChatTools(b, []byte(tools))
		}
		if string(b) != s {
			t.Fatalf("re-encoding %q gave %q", s, b)
		}
		n := 0
		ForEachChatMessage(s, func(r, c string) bool {
			if (msg{r, c}) != msgs[n] {
				t.Fatalf("message %d: %q, forEachChat %q", n, msg{r, c}, msgs[n])
			}
			n++
			return true
		})
	})
}
