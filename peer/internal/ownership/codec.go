package ownership

import (
	"encoding/binary"
	"fmt"
)

// commandVersion is the first byte of an encoded command: a member that
// reads another version refuses the entry (ErrBadCommand) rather than
// guess.
const commandVersion = 1

// maxIDLen bounds member IDs in commands (gossip names are shorter).
const maxIDLen = 255

// Encode appends c's wire form to b: a version byte, then the fields as
// uvarints and length-prefixed strings.
func (c Command) Encode(b []byte) []byte {
	b = append(b, commandVersion, byte(c.Kind))
	b = appendString(b, c.Member)
	b = binary.AppendUvarint(b, c.Epoch)
	b = binary.AppendUvarint(b, c.Version)
	b = binary.AppendUvarint(b, c.Seq)
	b = binary.AppendUvarint(b, uint64(c.P))
	b = appendString(b, c.To)
	b = binary.AppendUvarint(b, c.ToEpoch)
	if c.Ended {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode parses a command written by Encode. Malformed input returns an
// error wrapping ErrBadCommand.
func Decode(b []byte) (Command, error) {
	d := decoder{b: b}
	var c Command
	if v := d.byte(); v != commandVersion {
		return Command{}, fmt.Errorf("%w: version %d", ErrBadCommand, v)
	}
	c.Kind = Kind(d.byte())
	c.Member = d.string()
	c.Epoch = d.uvarint()
	c.Version = d.uvarint()
	c.Seq = d.uvarint()
	p := d.uvarint()
	c.To = d.string()
	c.ToEpoch = d.uvarint()
	ended := d.byte()
	if d.err != nil {
		return Command{}, d.err
	}
	if len(d.b) != 0 || ended > 1 || p > 1<<20 || c.Kind < Join || c.Kind > Grant {
		return Command{}, fmt.Errorf("%w: malformed", ErrBadCommand)
	}
	c.P, c.Ended = int(p), ended == 1
	return c, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated", ErrBadCommand)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if n > maxIDLen || n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
