package lbipam

import (
	"strings"
	"testing"
)

func TestParsePools(t *testing.T) {
	for _, tc := range []struct {
		in          []string
		first, last string
		err         string
	}{
		{in: []string{"192.0.2.0/24"}, first: "192.0.2.1", last: "192.0.2.254"},
		{in: []string{"192.0.2.8/31"}, first: "192.0.2.8", last: "192.0.2.9"},
		{in: []string{"192.0.2.7/32"}, first: "192.0.2.7", last: "192.0.2.7"},
		{in: []string{" 10.0.0.10 - 10.0.0.20 "}, first: "10.0.0.10", last: "10.0.0.20"},
		{in: []string{"fd00:10::/120"}, first: "fd00:10::", last: "fd00:10::ff"},
		{in: []string{"10.0.0.20-10.0.0.10"}, err: "lower to a higher"},
		{in: []string{"10.0.0.1-fd00::1"}, err: "one family"},
		{in: []string{"10.0.0.0/33"}, err: "want a CIDR"},
		{in: []string{"nope"}, err: "want a CIDR"},
		{in: []string{"10.0.0.0/24,10.0.0.128-10.0.0.130"}, err: "overlaps"},
	} {
		got, err := ParsePools(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != 1 || got[0].First.String() != tc.first || got[0].Last.String() != tc.last {
			t.Errorf("%v: %v %v, want %s-%s", tc.in, got, err, tc.first, tc.last)
		}
	}
}
