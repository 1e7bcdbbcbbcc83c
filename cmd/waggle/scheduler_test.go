package main

import (
	"testing"

	"github.com/waggle-io/waggle/internal/secureserving"
)

// TestHealthAddrMapsOntoSecureServing: the scheduler's former plain-HTTP
// --health-addr still selects the address, now served over HTTPS.
func TestHealthAddrMapsOntoSecureServing(t *testing.T) {
	for _, tc := range []struct {
		in       string
		wantAddr string
		wantPort int
		wantErr  bool
	}{
		{"127.0.0.1:10259", "127.0.0.1", 10259, false},
		{":17359", "0.0.0.0", 17359, false},
		{"0", "0.0.0.0", 0, false},
		{"", "0.0.0.0", 0, false},
		{"nope", "", 0, true},
	} {
		o := secureserving.Defaults(10259)
		err := healthAddr(&o, tc.in)
		if (err != nil) != tc.wantErr {
			t.Fatalf("%q: err %v", tc.in, err)
		}
		if err == nil && (o.BindAddress != tc.wantAddr || o.SecurePort != tc.wantPort) {
			t.Errorf("%q: %s:%d", tc.in, o.BindAddress, o.SecurePort)
		}
	}
}
