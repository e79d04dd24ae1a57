// Package zmqaddr checks the ZMQ addresses of KV-event sockets, for the
// configuration's validation and the subscriber alike, so that an address
// the configuration accepts is one the subscriber can dial or bind.
package zmqaddr

import (
	"fmt"
	"strconv"
	"strings"
)

// Check reports why a is not an address the subscriber can use:
// tcp://host:port with a port 1-65535, ipc://path or inproc://name; a "*"
// host (a bind address) only when listen.
func Check(a string, listen bool) error {
	for _, p := range []string{"tcp://", "ipc://", "inproc://"} {
		if !strings.HasPrefix(a, p) || len(a) == len(p) {
			continue
		}
		if !listen && strings.Contains(a, "*") {
			return fmt.Errorf("%q is a bind address; give the engine's host", a)
		}
		if p == "tcp://" {
			i := strings.LastIndexByte(a, ':')
			if n, err := strconv.Atoi(a[i+1:]); i < len(p) || err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("%q has no port 1-65535 (tcp://host:port)", a)
			}
		}
		return nil
	}
	return fmt.Errorf("%q is not a tcp://, ipc:// or inproc:// address", a)
}
