package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// TestConnectKubeNamespace: outside a cluster, discovery watches the
// kubeconfig's current context's namespace when the config names none,
// as kubectl does, and "default" when the context names none either.
// Before, it was always "default": a user whose context is "inference"
// got a silently empty pool.
func TestConnectKubeNamespace(t *testing.T) {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: with
  context: {cluster: c, user: u, namespace: inference}
- name: without
  context: {cluster: c, user: u}
current-context: %s
users:
- name: u
  user: {token: t}
`
	for _, tc := range []struct{ context, want string }{{"with", "inference"}, {"without", "default"}} {
		t.Run(tc.context, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			if err := os.WriteFile(path, fmt.Appendf(nil, kubeconfig, tc.context), 0o600); err != nil {
				t.Fatal(err)
			}
			_, ns, err := connectKube(&config.Kubernetes{Service: "vllm", Kubeconfig: path})
			if err != nil {
				t.Fatal(err)
			}
			if ns != tc.want {
				t.Errorf("namespace %q, want %q", ns, tc.want)
			}
		})
	}
}
