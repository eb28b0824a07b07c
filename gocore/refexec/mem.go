package refexec

import (
	"math"
	"unsafe"

	"mpk/gocore/ir"
)

// mem is one buffer's memory: caller memory (inputs, outputs) or a Go slice
// (temporaries). Values pass through float64; stores round to the dtype.
type mem struct {
	base unsafe.Pointer
	dt   ir.DType
	n    int64
}

func (m mem) load(i int64) float64 {
	p := unsafe.Add(m.base, i*m.dt.Size())
	switch m.dt {
	case ir.F32:
		return float64(*(*float32)(p))
	case ir.BF16:
		return float64(math.Float32frombits(uint32(*(*uint16)(p)) << 16))
	case ir.F16:
		return halfToFloat(*(*uint16)(p))
	case ir.F64:
		return *(*float64)(p)
	case ir.I64:
		return float64(*(*int64)(p))
	case ir.I32:
		return float64(*(*int32)(p))
	case ir.I16:
		return float64(*(*int16)(p))
	case ir.I8:
		return float64(*(*int8)(p))
	case ir.U8:
		return float64(*(*uint8)(p))
	case ir.Bool:
		if *(*uint8)(p) != 0 {
			return 1
		}
		return 0
	}
	panic("unknown dtype")
}

func (m mem) store(i int64, v float64) {
	p := unsafe.Add(m.base, i*m.dt.Size())
	switch m.dt {
	case ir.F32:
		*(*float32)(p) = float32(v)
	case ir.BF16:
		*(*uint16)(p) = floatToBF16(float32(v))
	case ir.F16:
		*(*uint16)(p) = floatToHalf(v)
	case ir.F64:
		*(*float64)(p) = v
	case ir.I64:
		*(*int64)(p) = int64(v)
	case ir.I32:
		*(*int32)(p) = int32(v)
	case ir.I16:
		*(*int16)(p) = int16(v)
	case ir.I8:
		*(*int8)(p) = int8(v)
	case ir.U8:
		*(*uint8)(p) = uint8(v)
	case ir.Bool:
		if v != 0 {
			*(*uint8)(p) = 1
		} else {
			*(*uint8)(p) = 0
		}
	}
}

// round gives the value v takes when stored as dt.
func round(dt ir.DType, v float64) float64 {
	switch dt {
	case ir.F32:
		return float64(float32(v))
	case ir.BF16:
		return float64(math.Float32frombits(uint32(floatToBF16(float32(v))) << 16))
	case ir.F16:
		return halfToFloat(floatToHalf(v))
	case ir.F64:
		return v
	case ir.Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return math.Trunc(v)
}

// floatToBF16 rounds to nearest even, keeping NaN a NaN.
func floatToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 31:
		if frac == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}

func floatToHalf(v float64) uint16 {
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	switch {
	case math.IsNaN(v):
		return 0x7e00
	case v >= 65520:
		return sign | 0x7c00
	case v < math.Pow(2, -25):
		return sign
	}
	e := math.Floor(math.Log2(v))
	if e < -14 { // subnormal: units of 2^-24
		return sign | uint16(math.RoundToEven(v/math.Pow(2, -24)))
	}
	m := math.RoundToEven((v/math.Pow(2, e) - 1) * 1024)
	if m == 1024 {
		m, e = 0, e+1
	}
	return sign | uint16(e+15)<<10 | uint16(m)
}
