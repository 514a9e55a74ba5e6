package peer

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// fakeLeaver is a logLeaver whose answers the test sets: this member is
// a voter until Voter has been asked voterFor times (never, when 0).
type fakeLeaver struct {
	left        bool // what Leave answers
	voters      int
	othersFresh bool
	voterFor    int64
	asked       int64 // calls of Voter (awaitRemoved polls on its caller's goroutine)
}

func (f *fakeLeaver) TransferLeadership(context.Context) {}
func (f *fakeLeaver) Leave(context.Context) bool         { return f.left }
func (f *fakeLeaver) Voters() int                        { return f.voters }
func (f *fakeLeaver) OthersFresh(context.Context) bool   { return f.othersFresh }
func (f *fakeLeaver) Describe(context.Context) string    { return "fake" }
func (f *fakeLeaver) Voter() bool {
	f.asked++
	return f.voterFor == 0 || f.asked < f.voterFor
}

// TestAwaitRemovedLastVoter: the log's last voter waits while another
// member is live in the table, until its vote has gone to that member;
// with nobody else live it goes at once. When it went at once as the
// last voter, a learner not yet promoted was left with a log nobody could
// commit to (a loaded TestLogTwoMembersVoterLeaves: the other member
// never decided again).
func TestAwaitRemovedLastVoter(t *testing.T) {
	for _, tc := range []struct {
		name        string
		f           fakeLeaver
		want        bool
		minAsked    int64 // Voter asked at least this often: it waited
		maxAsked    int64 // at most this often (0: no bound)
		shortWaitOK bool
	}{
		{"last voter, another member live: waits for the vote to move", fakeLeaver{voters: 1, othersFresh: true, voterFor: 4}, true, 4, 0, false},
		{"last voter, nobody else live: goes at once", fakeLeaver{voters: 1}, true, 1, 1, false},
		{"one of three voters: waits to be removed", fakeLeaver{voters: 3, voterFor: 3}, true, 3, 0, false},
		{"never removed: gives up at the limit", fakeLeaver{voters: 3, othersFresh: true}, false, 2, 0, true},
		{"not a voter: goes at once", fakeLeaver{voters: 3, voterFor: 1}, true, 1, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			limit := 5 * time.Second
			if tc.shortWaitOK {
				limit = 100 * time.Millisecond
			}
			got := awaitRemoved(context.Background(), &f, limit)
			asked := f.asked
			if got != tc.want || asked < tc.minAsked || (tc.maxAsked > 0 && asked > tc.maxAsked) {
				t.Fatalf("awaitRemoved = %v after %d checks; want %v after %d to %d", got, asked, tc.want, tc.minAsked, tc.maxAsked)
			}
		})
	}
}

// TestLeaveLogNotApplied: when the log does not apply the leave (no
// majority, or the close deadline), leaving says so: Close returns the
// error. It returned nil, and the member went still live in the table.
func TestLeaveLogNotApplied(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	err := leaveLog(context.Background(), &fakeLeaver{left: false, voters: 3}, 10*time.Millisecond, quiet)
	if err == nil || !strings.Contains(err.Error(), "did not apply this member's leave") {
		t.Fatalf("leaveLog with the leave unapplied: %v; want the error that says so", err)
	}
	f := &fakeLeaver{left: true, voters: 1}
	if err := leaveLog(context.Background(), f, 10*time.Millisecond, quiet); err != nil {
		t.Fatalf("leaveLog with the leave applied, nobody else live: %v", err)
	}
}
