package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPartitionsFor(t *testing.T) {
	for _, c := range []struct {
		members, want int
	}{
		{1, DefaultPartitionCount},
		{16, DefaultPartitionCount},
		{17, 277}, // 272 and up: the first prime
		{32, 521},
		{256, 4099},
		{1024, 16411},
		{MaxExpectedMembers, 64007},
	} {
		got, err := PartitionsFor(c.members)
		if err != nil || got != c.want {
			t.Errorf("PartitionsFor(%d) = %d, %v; want %d, nil", c.members, got, err, c.want)
		}
		if err := (Config{PartitionCount: got}).Validate(); err != nil {
			t.Errorf("PartitionsFor(%d) = %d does not validate: %v", c.members, got, err)
		}
		if got < PartitionsPerMember*c.members || !prime(got) {
			t.Errorf("PartitionsFor(%d) = %d: want a prime of at least %d", c.members, got, PartitionsPerMember*c.members)
		}
	}
	for _, bad := range []int{0, -1, MaxExpectedMembers + 1} {
		if got, err := PartitionsFor(bad); !errors.Is(err, ErrInvalidConfig) || got != 0 {
			t.Errorf("PartitionsFor(%d) = %d, %v; want 0 and ErrInvalidConfig", bad, got, err)
		}
	}
}

// spread is how many partitions the members of one ring own, lowest to
// highest.
type spread struct {
	min, p10, median, max, empty, bound int
}

func spreadOf(t *testing.T, cfg Config, members []string) spread {
	t.Helper()
	s, err := New(cfg, members, 1)
	if err != nil {
		t.Fatal(err)
	}
	owned := slices.Clone(s.owned)
	slices.Sort(owned)
	n := len(owned)
	sp := spread{min: owned[0], p10: owned[n/10], median: owned[n/2], max: owned[n-1]}
	for _, o := range owned {
		if o == 0 {
			sp.empty++
		}
	}
	// The cap the bounded-load rule promises, computed here from its
	// definition rather than by the code under test.
	sp.bound = int(math.Ceil(float64(s.cfg.PartitionCount) / float64(n) * s.cfg.Load))
	return sp
}

// TestPartitionSpread shows how many partitions each member owns at 32,
// 256 and 1 024 members, with the default count and with PartitionsFor's,
// for three random sets of member names each (seeded), and checks the
// sizing rule's two claims: the bounded-load cap holds (no member above
// ceil(partitions/members × Load)) and no member is left empty. It also
// checks that the default count does leave members empty at 256 and up:
// the reason PartitionsFor exists. Pure ring computation: well under a
// second. Run with -v for the table.
func TestPartitionSpread(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed, 54))
	for _, n := range []int{32, 256, 1024} {
		sized, err := PartitionsFor(n)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			members := make([]string, n)
			for i := range members {
				members[i] = fmt.Sprintf("node-%016x", rng.Uint64())
			}
			def := spreadOf(t, Config{}, members)
			got := spreadOf(t, Config{PartitionCount: sized}, members)
			t.Logf("members=%4d names#%d partitions=%5d: min %2d, p10 %2d, median %2d, max %2d (bound %2d), empty %d; "+
				"partitions=%d: min %d, median %d, max %d, empty %d",
				n, round, sized, got.min, got.p10, got.median, got.max, got.bound, got.empty,
				DefaultPartitionCount, def.min, def.median, def.max, def.empty)
			if got.max > got.bound || def.max > def.bound {
				t.Errorf("members=%d: a member owns %d (sized) or %d (default) partitions, above the bounded-load caps %d and %d",
					n, got.max, def.max, got.bound, def.bound)
			}
			if got.empty > 0 || got.min < 2 {
				t.Errorf("members=%d, %d partitions: %d members own nothing, the least loaded owns %d; want none empty and at least 2",
					n, sized, got.empty, got.min)
			}
			if n >= 256 && def.empty == 0 {
				t.Errorf("members=%d, %d partitions: no member is empty; the default count was expected to leave some empty", n, DefaultPartitionCount)
			}
		}
	}
}
