package eviction

import (
	"testing"
)

// FuzzParseThresholdConfig: any flag input is parsed or refused, never a
// panic, and what is accepted is a known signal with a usable value.
func FuzzParseThresholdConfig(f *testing.F) {
	for _, seed := range [][3]string{
		{"memory.available", "100Mi", ""},
		{"nodefs.available", "10%", ""},
		{"imagefs.inodesFree", "5.5%", "1m"},
		{"pid.available", "1k", "30s"},
		{"memory.available", "-1", ""},
		{"nodefs.available", "NaN%", ""},
		{"swap.available", "1Gi", ""},
		{"memory.available", "1e400", "-1s"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, signal, value, grace string) {
		hard := map[string]string{signal: value}
		th, err := ParseThresholdConfig(hard, nil, nil, nil)
		if err == nil {
			for _, x := range th {
				if !validSignal(x.Signal) {
					t.Fatalf("accepted unknown signal %q", x.Signal)
				}
				if p := x.Value.Percentage; x.Value.Quantity == nil && !(p >= 0 && p <= 1) {
					t.Fatalf("accepted percentage %v from %q", x.Value.Percentage, value)
				}
				if x.Value.Quantity != nil && x.Value.Quantity.Sign() <= 0 {
					t.Fatalf("accepted non-positive quantity from %q", value)
				}
			}
		}
		_, _ = ParseThresholdConfig(nil, hard, map[string]string{signal: grace}, map[string]string{signal: value})
	})
}
