package httplimit

import (
	"net/http"
	"time"
)

// SetLogClockForTest replaces the log throttle's clock of h, a handler
// Middleware returned.
func SetLogClockForTest(h http.Handler, now func() time.Time) { h.(*middleware).now = now }
