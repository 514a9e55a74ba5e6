package peer

import (
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// applyReplica applies replicated admissions to the backup's store (pt
// locked by awaitReplica) and, with a data directory, logs the keys of
// policies kept on disk: idx is the record to Sync before answering (0:
// none to wait for).
func (lo *logOwner) applyReplica(pt *part, pid int, h opHead, keys []packedAdmit, now time.Time) (opResult, uint64) {
	n := lo.n
	if h.seq != 0 {
		if h.seq < pt.Rep.Seq {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}, 0 // delivered late: applying it could undo later ones
		}
		pt.Rep.Seq = h.seq
	}
	accepted := 0
	for _, k := range keys {
		if h.kind == peerpb.PartitionOp_KIND_REPLACE {
			pt.Store.Delete(k.st.Key)
			if len(k.st.Runs) == 0 && len(k.st.Reservations) == 0 && len(k.st.Grants) == 0 {
				accepted++
				continue
			}
		}
		if err := pt.Store.Import(k.st, k.sp, now); err != nil {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC, accepted: uint32(accepted)}, 0
		}
		accepted++
	}
	idx, err := n.durableReplica(pid, h.epoch, pt.Store, keys, now)
	if err != nil {
		return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}, 0
	}
	n.metrics.Backup("received", "ok", accepted)
	return opResult{status: peerpb.OpStatus_OP_STATUS_OK, accepted: uint32(accepted)}, idx
}
