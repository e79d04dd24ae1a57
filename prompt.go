package kvroute

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
)

// The canonical chat prompt is the text the router hashes for a chat
// request (Request.Prompt). Each message is written as
//
//	<len(role)>:<role>,<content with every NUL byte written as NUL 0x01>[NUL 0x02 <tool calls JSON>]NUL NUL
//
// after the request's tools, when it has some: NUL 0x03 <tools JSON> NUL NUL.
//
// The form is injective (no two conversations share a canonical text, since
// the role is length-framed and the content's terminator cannot occur inside
// escaped content) and prefix-preserving in two ways that prefix caching
// needs: a conversation's text is a prefix of its continuation's, and two
// conversations whose last messages share a long prefix share that prefix in
// their canonical texts too. (Framing the content by its length would lose
// the second property: the length comes first and differs.)
const (
	chatNUL     = 0x00
	chatEscaped = 0x01
)

// AppendChatMessage appends one message in canonical form to dst.
func AppendChatMessage(dst []byte, role, content []byte) []byte {
	dst = AppendChatRole(dst, role)
	dst = AppendChatContent(dst, content)
	return append(dst, chatNUL, chatNUL)
}

// AppendChatRole appends the role header of a canonical message.
func AppendChatRole(dst, role []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(role)), 10)
	dst = append(dst, ':')
	dst = append(dst, role...)
	return append(dst, ',')
}

// AppendChatContent appends content with its NUL bytes escaped; the caller
// terminates it with ChatTerminator.
func AppendChatContent(dst, content []byte) []byte {
	for {
		i := bytes.IndexByte(content, chatNUL)
		if i < 0 {
			return append(dst, content...)
		}
		dst = append(dst, content[:i+1]...)
		dst = append(dst, chatEscaped)
		content = content[i+1:]
	}
}

// ChatTerminator ends a canonical message's content.
const ChatTerminator = "\x00\x00"

// A message's tool calls follow its content after NUL 0x02, and a
// request's tools come before its first message after NUL 0x03, each as
// its JSON (which has no NUL byte) and the latter ended by the
// terminator: escaped content has a NUL only before 0x01, and a message
// starts with a digit, so the form stays injective.
const (
	chatToolCalls = 0x02
	chatTools     = 0x03
)

// AppendChatToolCalls appends a message's tool calls (their JSON) after
// its content; the caller then terminates the message.
func AppendChatToolCalls(dst, toolCalls []byte) []byte {
	dst = append(dst, chatNUL, chatToolCalls)
	return append(dst, toolCalls...)
}

// PrependChatTools puts a request's tools (their JSON) before the
// canonical messages in dst, in place when dst has the room.
func PrependChatTools(dst, tools []byte) []byte {
	n := 2 + len(tools) + len(ChatTerminator)
	dst = slices.Grow(dst, n)[:len(dst)+n]
	copy(dst[n:], dst[:len(dst)-n])
	dst[0], dst[1] = chatNUL, chatTools
	copy(dst[2:], tools)
	copy(dst[2+len(tools):], ChatTerminator)
	return dst
}

// ForEachChatMessage calls fn for each message of a canonical chat prompt,
// in order, until fn returns false. It reports whether prompt is in
// canonical chat form as far as it read it: entirely, unless fn stopped
// it (what follows the message fn returned false for is not checked); fn
// may have been called for a valid prefix when it is not. Content is
// unescaped (allocating only when it held NUL bytes); the request's tools
// and a message's tool calls are skipped.
func ForEachChatMessage(prompt string, fn func(role, content string) bool) bool {
	return forEachChat(prompt, nil, func(role, content, _ string) bool { return fn(role, content) })
}

// forEachChat is ForEachChatMessage with each message's tool calls (their
// JSON, "" for none) and, when tools is not nil, the request's tools.
func forEachChat(prompt string, tools *string, fn func(role, content, toolCalls string) bool) bool {
	if prompt == "" {
		return false
	}
	i := 0
	if prompt[0] == chatNUL {
		// The tools: NUL 0x03 <JSON, no NUL> NUL NUL.
		end := strings.IndexByte(prompt[min(2, len(prompt)):], chatNUL) + 2
		if len(prompt) < 2 || prompt[1] != chatTools || end <= 2 || end+1 >= len(prompt) || prompt[end+1] != chatNUL {
			return false
		}
		if tools != nil {
			*tools = prompt[2:end]
		}
		i = end + 2
		if i == len(prompt) {
			return false // no message
		}
	}
	for i < len(prompt) {
		// Role: <len>:<role>,
		j := i
		n := 0
		for j < len(prompt) && prompt[j] >= '0' && prompt[j] <= '9' && j-i < 6 {
			n = n*10 + int(prompt[j]-'0')
			j++
		}
		if j == i || j >= len(prompt) || prompt[j] != ':' || j+1+n >= len(prompt) || prompt[j+1+n] != ',' ||
			prompt[i] == '0' && j-i > 1 { // a length has no leading zeros
			return false
		}
		role := prompt[j+1 : j+1+n]
		// Content up to an unescaped NUL NUL (or NUL 0x02 and tool calls).
		k := j + 2 + n
		start, escaped := k, false
		for {
			if k+1 >= len(prompt) {
				return false
			}
			if prompt[k] != chatNUL {
				k++
				continue
			}
			if prompt[k+1] == chatNUL || prompt[k+1] == chatToolCalls {
				break
			}
			if prompt[k+1] != chatEscaped {
				return false
			}
			escaped = true
			k += 2
		}
		content := prompt[start:k]
		if escaped {
			content = unescapeChat(content)
		}
		next, calls := k+2, ""
		if prompt[k+1] == chatToolCalls {
			// The tool calls' JSON (no NUL) up to the terminator.
			end := strings.IndexByte(prompt[next:], chatNUL)
			if end <= 0 || next+end+1 >= len(prompt) || prompt[next+end+1] != chatNUL {
				return false
			}
			calls = prompt[next : next+end]
			next += end + 2
		}
		if !fn(role, content, calls) {
			return true
		}
		i = next
	}
	return true
}

func unescapeChat(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		b = append(b, s[i])
		if s[i] == chatNUL {
			i++ // skip the escape byte
		}
	}
	return string(b)
}
