package proxy

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
)

// sessionSource finds a request's session (or document) affinity key, as
// a model's router.session configures it: the header, then the body field,
// then the prompt expression, then (optionally) the user field.
type sessionSource struct {
	header string
	field  bool // the body field is configured (the scanner reads it)
	re     *regexp.Regexp
	user   bool
}

func newSessionSource(s config.Session) *sessionSource {
	src := &sessionSource{header: s.Header, field: s.JSONField != "", user: s.User}
	if s.PromptRegexp != "" {
		src.re = regexp.MustCompile(s.PromptRegexp) // config.Validate compiled it
	}
	return src
}

// key returns the request's affinity key, or "". The key never aliases
// ri.Prompt, whose storage is recycled after the request.
func (s *sessionSource) key(h http.Header, ri *openai.RequestInfo) string {
	if k := h.Get(s.header); k != "" {
		return k
	}
	if s.field && ri.SessionValue != "" {
		return ri.SessionValue
	}
	if s.re != nil {
		if m := s.re.FindStringSubmatch(ri.Prompt); m != nil {
			return strings.Clone(m[len(m)-1])
		}
	}
	if s.user {
		return ri.User
	}
	return ""
}
