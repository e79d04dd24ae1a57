package kvroute

import (
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
	for _, bad := range []string{"plain text", "4:user,hello", "4:user,hi\x00\x02\x00\x00", "x:y,"} {
		if ForEachChatMessage(bad, func(string, string) bool { return true }) {
			t.Fatalf("%q recognised as canonical", bad)
		}
	}
}

func FuzzForEachChatMessage(f *testing.F) {
	f.Add("4:user,hello\x00\x00")
	f.Add("6:system,x\x00\x01y\x00\x004:user,z\x00\x00")
	f.Add("plain")
	f.Fuzz(func(t *testing.T, s string) {
		var msgs []msg
		if !ForEachChatMessage(s, func(r, c string) bool { msgs = append(msgs, msg{r, c}); return true }) {
			return
		}
		if got := canon(msgs...); got != s {
			t.Fatalf("re-encoding %q gave %q", s, got)
		}
	})
}
