package peer

import "syscall"

// fleetSysProcAttr has the kernel kill a fleet process when the test
// process dies (a panic, a timeout's kill, ^C), so that no serve of an
// interrupted run outlives it holding its ports. Pdeathsig follows the
// thread that started the child; the test starts them from goroutines
// that lock no thread, whose threads the Go runtime keeps.
func fleetSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
