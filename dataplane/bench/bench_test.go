package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestStatSummarizeTakesMedianAndRange(t *testing.T) {
	cases := []struct {
		rounds           []float64
		median, min, max float64
	}{
		{[]float64{3}, 3, 3, 3},
		{[]float64{5, 1, 3}, 3, 1, 5},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
	}
	for _, c := range cases {
		s := &Stat{Rounds: c.rounds}
		s.summarize()
		if s.Median != c.median || s.Min != c.min || s.Max != c.max {
			t.Errorf("%v: median %v [%v–%v], want %v [%v–%v]", c.rounds, s.Median, s.Min, s.Max, c.median, c.min, c.max)
		}
	}
}

func TestHumanGroupsThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 15012.4: "15,012", 1234567: "1,234,567"} {
		if got := human(in); got != want {
			t.Errorf("human(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestTableShowsRatiosErrorsAndMissingPaths(t *testing.T) {
	r := &Report{Kernel: "6.x", CPUs: 2, Clients: 4, Backends: 4, Payload: 1, Duration: "1s", Rounds: 3,
		Rows: []Row{{Services: 10000, Test: "TCP_CRR", Paths: map[string]*Stat{
			"direct": {Median: 15000, Min: 14000, Max: 16000, Ratio: 1},
			"ebpf":   {Median: 14700, Min: 14000, Max: 15000, Ratio: 0.98, Errors: 2},
		}}}}
	var out bytes.Buffer
	r.print(Config{Out: &out}, []string{"direct", "ebpf", "iptables"})
	for _, want := range []string{"| 10,000 | TCP_CRR | 15,000 [14,000–16,000] | 14,700 (0.98×) [14,000–15,000] (2 errors) | – |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
