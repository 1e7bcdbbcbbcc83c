package procfs

import (
	"os"
	"testing"
)

func TestParseStatCountsFieldsFromTheLastParenthesis(t *testing.T) {
	line := "4242 (a (weird) name) Z 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"
	st, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != 'Z' || st.StartTime != 987654 {
		t.Fatalf("got %+v", st)
	}
	for _, bad := range []string{"", "1 (x) R 1 2", "1 x R"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

func TestOwnProcessIsLiveAndHasAStartTime(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil || st.StartTime == 0 || Gone(os.Getpid()) {
		t.Fatalf("own process: %+v %v", st, err)
	}
	if !Gone(1 << 30) {
		t.Fatal("a PID that cannot exist is not gone")
	}
}
