package job

import (
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// indexSet is a set of completion indexes, written as Kubernetes writes
// status.completedIndexes and status.failedIndexes: sorted, comma separated,
// runs of two or more consecutive indexes as "a-b" ("1,3-5,7").
type indexSet map[int]bool

// parseIndexes reads an index list; entries that are not indexes below
// completions are dropped, as upstream drops them.
func parseIndexes(s string, completions int) indexSet {
	out := indexSet{}
	if s == "" {
		return out
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		for i := a; i <= b && i < completions; i++ {
			if i >= 0 {
				out[i] = true
			}
		}
	}
	return out
}

func (s indexSet) sorted() []int {
	out := make([]int, 0, len(s))
	for i := range s {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// String renders the set in the status format.
func (s indexSet) String() string {
	idx := s.sorted()
	var b strings.Builder
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(idx[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(idx[j]))
		}
		i = j + 1
	}
	return b.String()
}

// podIndex returns the completion index a pod of an Indexed Job carries
// (annotation, else label), or -1.
func podIndex(p *corev1.Pod) int {
	v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		v, ok = p.Labels[batchv1.JobCompletionIndexAnnotation]
	}
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 {
		return -1
	}
	return i
}

// indexFailures returns the failure count a pod's index had when the pod was
// created (the job-index-failure-count annotation) and the ignored ones.
func indexFailures(p *corev1.Pod) (counted, ignored int) {
	counted, _ = strconv.Atoi(p.Annotations[batchv1.JobIndexFailureCountAnnotation])
	ignored, _ = strconv.Atoi(p.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation])
	return counted, ignored
}
