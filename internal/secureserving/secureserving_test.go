package secureserving

import (
	"flag"
	"slices"
	"strings"
	"testing"
)

// TestFlagsAndValidation: upstream's flag names and defaults, and the
// errors of a bad address, port or half a certificate pair.
func TestFlagsAndValidation(t *testing.T) {
	o := Defaults(10259)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.AddFlags(fs)
	if !slices.Equal(o.AlwaysAllowPaths, []string{"/healthz", "/readyz", "/livez"}) || o.BindAddress != "0.0.0.0" {
		t.Fatalf("defaults %+v", o)
	}
	if err := fs.Parse([]string{"--secure-port=17399", "--bind-address=127.0.0.1", "--authorization-always-allow-paths=/healthz, /metrics"}); err != nil {
		t.Fatal(err)
	}
	if o.SecurePort != 17399 || o.BindAddress != "127.0.0.1" || !slices.Equal(o.AlwaysAllowPaths, []string{"/healthz", "/metrics"}) {
		t.Fatalf("parsed %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"bad address", func(o *Options) { o.BindAddress = "localhost" }, "--bind-address"},
		{"bad port", func(o *Options) { o.SecurePort = 70000 }, "--secure-port"},
		{"half a pair", func(o *Options) { o.TLSCertFile = "x.crt" }, "--tls-private-key-file"},
	} {
		c := o
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	off := Options{}
	if s, err := New(off, "x", nil, nil, nil); s != nil || err != nil || off.Enabled() {
		t.Fatalf("port 0: %v %v", s, err)
	}
}
