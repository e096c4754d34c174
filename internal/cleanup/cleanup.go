// Package cleanup is a stack of undo steps for building something in
// several steps, each of which may fail (after gVisor's pkg/cleanup):
//
//	var c cleanup.Stack
//	defer c.Clean()
//	f, err := open()
//	if err != nil {
//		return err // Clean undoes nothing more
//	}
//	c.Add(func() { f.Close() })
//	if err := mount(); err != nil {
//		return err // Clean closes f
//	}
//	c.Add(unmount)
//	c.Release() // built: nothing is undone
//	return nil
package cleanup

// Stack holds undo steps. The zero value is empty and ready to use. It is
// not safe for concurrent use: one goroutine builds one thing.
type Stack struct {
	fns []func()
}

// Add pushes f; Clean runs it before every step added earlier.
func (s *Stack) Add(f func()) { s.fns = append(s.fns, f) }

// Clean runs the steps in reverse order of Add and empties the stack: a
// repeated Clean, or a Clean after Release, does nothing.
func (s *Stack) Clean() {
	for i := len(s.fns) - 1; i >= 0; i-- {
		s.fns[i]()
	}
	s.fns = nil
}

// Release empties the stack without running the steps and returns them as
// one function that runs them in reverse order (for an owner that undoes
// them later, e.g. at Close).
func (s *Stack) Release() func() {
	fns := s.fns
	s.fns = nil
	return func() {
		for i := len(fns) - 1; i >= 0; i-- {
			fns[i]()
		}
	}
}
