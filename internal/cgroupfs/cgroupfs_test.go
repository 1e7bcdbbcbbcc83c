package cgroupfs

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseFindsV2AndV1ControllersOfAHybridHost(t *testing.T) {
	table := `tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
bpf /sys/fs/bpf bpf rw 0 0
`
	got, err := parse(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{Path: "/sys/fs/cgroup/cpu", Controllers: []string{"cpu"}},
		{Path: "/sys/fs/cgroup/memory", Controllers: []string{"memory"}},
		{Path: "/sys/fs/cgroup/systemd"},
		{Path: "/sys/fs/cgroup/unified", V2: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseIgnoresMalformedLines(t *testing.T) {
	got, err := parse(strings.NewReader("garbage\n\ncgroup2\n"))
	if err != nil || len(got) != 0 {
		t.Fatalf("got %v, %v", got, err)
	}
}

func TestHierarchiesIsTheMountTableReadOnceAndHandsOutCopies(t *testing.T) {
	live, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, live) {
		t.Fatalf("Hierarchies %+v, the mount table %+v", got, live)
	}
	for i := range got {
		got[i].Path = "changed"
		for j := range got[i].Controllers {
			got[i].Controllers[j] = "changed"
		}
	}
	again, err := Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, live) {
		t.Fatalf("a caller's change reached the cache: %+v", again)
	}
}
