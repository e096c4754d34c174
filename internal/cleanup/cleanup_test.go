package cleanup

import (
	"slices"
	"testing"
)

func TestCleanRunsInReverseOnce(t *testing.T) {
	var got []int
	var s Stack
	for i := range 3 {
		s.Add(func() { got = append(got, i) })
	}
	s.Clean()
	s.Clean()
	if !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("ran %v, want [2 1 0] once", got)
	}
}

func TestReleaseHandsOverTheSteps(t *testing.T) {
	var got []int
	var s Stack
	s.Add(func() { got = append(got, 0) })
	s.Add(func() { got = append(got, 1) })
	undo := s.Release()
	s.Clean()
	if len(got) != 0 {
		t.Fatalf("Clean after Release ran %v", got)
	}
	undo()
	if !slices.Equal(got, []int{1, 0}) {
		t.Fatalf("released steps ran %v, want [1 0]", got)
	}
}
