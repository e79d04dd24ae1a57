package zmqaddr

import "testing"

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		listen bool
		ok     bool
	}{
		{"tcp://10.0.0.7:5557", false, true},
		{"tcp://[::1]:5557", false, true},
		{"tcp://*:5557", true, true},
		{"tcp://*:5557", false, false}, // a bind address to dial
		{"tcp://10.0.0.7", false, false},
		{"tcp://10.0.0.7:99999", false, false},
		{"tcp://10.0.0.7:0", false, false},
		{"tcp://10.0.0.7:abc", false, false},
		{"tcp://", false, false},
		{"ipc:///tmp/kv", false, true},
		{"inproc://kv", true, true},
		{"udp://10.0.0.7:5557", false, false},
		{"10.0.0.7:5557", false, false},
	} {
		if err := Check(tc.addr, tc.listen); (err == nil) != tc.ok {
			t.Errorf("Check(%q, listen %v) = %v, want ok %v", tc.addr, tc.listen, err, tc.ok)
		}
	}
}
