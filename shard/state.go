package shard

import (
	"fmt"
	"time"
)

// Run is part of an exported key state: Count units admitted Age before the
// export's now. Age may be negative by less than one resolution step (times
// are rounded up). For TokenBucket the single run's Age is now minus the
// theoretical arrival time and Count is zero; for FixedWindow it is the age of
// the window start and the window's count. For Calendar the single run's
// Age is not an age: it holds the period's start instant in Unix
// nanoseconds, and Count is the period's count (see Calendar). For Concurrency each run is one
// live lease: ID is its id, Count its units, and Age is now minus its
// expiry (negative: the lease has −Age left to live), so a receiver that
// rebases it keeps the lease at least as long as the sender would have.
type Run struct {
	Age   time.Duration
	Count int64
	// ID is the lease id (Concurrency only; zero for every other
	// algorithm).
	ID uint64
}

// KeyState is one key's state as a plain value, for handoff between nodes.
// Ages are relative to the sender's now; Import rebases them on the
// receiver's now, so clock offset between machines cannot make admissions
// expire early, and transfer delay only makes them expire later.
type KeyState struct {
	Key       Key
	Algorithm Algorithm
	// Runs are oldest first (non-increasing Age).
	Runs []Run
	// Reservations are the key's pending reservations (SlidingLog only;
	// see Store.Reserve): Age as in Runs, Count the estimate, ID the
	// reservation. Their units are counted in Runs too.
	Reservations []Run
	// Grants are the key's outstanding grants of rights (SlidingLog only;
	// see Store.Grant): Age is the age of the lease's end (negative while
	// the lease runs, at least −MaxGrantLease), Count the rights, ID the
	// grant. They are not counted in Runs.
	Grants []Run
}

// Validate reports whether the state is well formed: a valid key and
// algorithm, and runs oldest first with sensible counts.
func (s KeyState) Validate() error {
	if err := s.Key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidState, err)
	}
	if s.Algorithm >= numAlgorithms {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidState, s.Algorithm)
	}
	if s.Algorithm != SlidingLog && s.Algorithm != Concurrency && len(s.Runs) > 1 {
		return fmt.Errorf("%w: %v state has %d runs, want at most 1", ErrInvalidState, s.Algorithm, len(s.Runs))
	}
	if len(s.Reservations) > 0 && s.Algorithm != SlidingLog || len(s.Reservations) > MaxPendingReservations {
		return fmt.Errorf("%w: %d reservations under %v", ErrInvalidState, len(s.Reservations), s.Algorithm)
	}
	for i, r := range s.Reservations {
		if r.ID == 0 || r.Count <= 0 {
			return fmt.Errorf("%w: reservation %d has id %d and count %d", ErrInvalidState, i, r.ID, r.Count)
		}
	}
	if len(s.Grants) > 0 && s.Algorithm != SlidingLog || len(s.Grants) > 4*MaxGrants {
		return fmt.Errorf("%w: %d grants under %v", ErrInvalidState, len(s.Grants), s.Algorithm)
	}
	for i, r := range s.Grants {
		if r.ID == 0 || r.Count <= 0 || r.Count > maxSettle || r.Age < -MaxGrantLease {
			return fmt.Errorf("%w: grant %d has id %d, count %d and age %v", ErrInvalidState, i, r.ID, r.Count, r.Age)
		}
	}
	for i, r := range s.Runs {
		if r.Count < 0 || ((s.Algorithm == SlidingLog || s.Algorithm == Concurrency) && r.Count == 0) {
			return fmt.Errorf("%w: run %d has count %d", ErrInvalidState, i, r.Count)
		}
		if (s.Algorithm == Concurrency) != (r.ID != 0) {
			return fmt.Errorf("%w: run %d has lease id %d under %v", ErrInvalidState, i, r.ID, s.Algorithm)
		}
		if i > 0 && r.Age > s.Runs[i-1].Age {
			return fmt.Errorf("%w: run %d is older than run %d", ErrInvalidState, i, i-1)
		}
	}
	return nil
}
