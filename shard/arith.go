package shard

import "math"

// Saturating int64 arithmetic for times (ns since the Unix epoch) and
// durations. A sum past the int64 range would wrap to the other end and turn
// "far in the future" into "long ago": an expiry would come early, an idle
// key would be swept while it still holds admissions. Saturating instead
// keeps every comparison on the safe side: a saturated expiry is "never",
// a saturated cutoff is "everything is live".

// satAdd returns a + b, clamped to [math.MinInt64, math.MaxInt64].
func satAdd(a, b int64) int64 {
	s := a + b
	// Overflow happened iff a and b have the same sign and s has the other.
	if (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
		if a >= 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// satSub returns a − b, clamped to [math.MinInt64, math.MaxInt64].
func satSub(a, b int64) int64 {
	if b == math.MinInt64 {
		if a >= 0 {
			return math.MaxInt64
		}
		return a - b // a < 0: a − MinInt64 = a + 2^63 fits
	}
	return satAdd(a, -b)
}

// satMul returns a·b for a, b >= 0, clamped to math.MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
