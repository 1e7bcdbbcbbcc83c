package lab

import (
	"errors"
	"testing"
)

// The dual-stack scenario passes only when every attempt was answered and
// every backend answered at least once.
func TestAnsweredByWantsEveryBackend(t *testing.T) {
	out := []byte("first reply: pod=a client=[fd00::9]:1\npod=a client=[fd00::9]:1\npod=b client=[fd00::9]:2\ndial tcp x: 2 ok, 0 failed\n")
	if err := answeredBy(out, nil, []string{"a", "b"}); err != nil {
		t.Errorf("both answered: %v", err)
	}
	if err := answeredBy(out, nil, []string{"a", "b", "c"}); err == nil {
		t.Error("backend c never answered, yet accepted")
	}
	if err := answeredBy(out, errors.New("exit status 1"), []string{"a"}); err == nil {
		t.Error("a failed attempt (dial's exit status 1) accepted")
	}
}
