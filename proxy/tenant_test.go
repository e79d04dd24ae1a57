package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestTenantOf: the tenant is a trusted client's header, else its API
// key's digest, else the body's user field; a user field cannot name an
// API key's tenant (its digest shows in /debug/decisions), so a client
// without the key cannot share that key's fair share.
func TestTenantOf(t *testing.T) {
	withKey := httptest.NewRequest(http.MethodPost, PathChatCompletions, nil)
	withKey.Header.Set("Authorization", "Bearer sk-victim")
	victim := tenantOf(withKey, false, "alice")
	if len(victim) != len("key:")+16 || victim[:4] != "key:" {
		t.Fatalf("API key tenant %q, want key:<16 hex>", victim)
	}
	keyless := httptest.NewRequest(http.MethodPost, PathChatCompletions, nil)
	if got := tenantOf(keyless, false, victim); got == victim {
		t.Errorf("a keyless request with user %q is the key's tenant", victim)
	}
	if got := tenantOf(keyless, false, "alice"); got != "alice" {
		t.Errorf("user alice: tenant %q", got)
	}
	trusted := httptest.NewRequest(http.MethodPost, PathChatCompletions, nil)
	trusted.Header.Set(HeaderTenant, "team-a")
	trusted.Header.Set("Authorization", "Bearer sk-victim")
	if got := tenantOf(trusted, true, "alice"); got != "team-a" {
		t.Errorf("trusted header: tenant %q, want team-a", got)
	}
	if got := tenantOf(trusted, false, "alice"); got != victim {
		t.Errorf("untrusted client's header ignored: tenant %q, want the key's %q", got, victim)
	}
}
