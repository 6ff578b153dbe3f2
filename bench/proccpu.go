package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// clockTick is the unit of /proc/PID/stat's CPU times: USER_HZ, which
// Linux fixes at 100 for every program that reads them.
const clockTick = time.Second / 100

// ProcessCPU is the CPU time of process pid so far, every thread's. It
// reads the process's CPU-time clock (clock_gettime on the clock id that
// clock_getcpuclockid(3) makes for pid), to the nanosecond. Where the
// kernel offers no clock of another process (gVisor's, on some of the
// machines the pinned runs use) it reads utime and stime of
// /proc/PID/stat instead, to the clock tick, so that a run still reports
// CPU per call over its seconds, coarsely, rather than nothing.
func ProcessCPU(pid int) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(int32((^pid)<<3|2), &ts); err == nil { // CPUCLOCK_SCHED of the whole process
		return time.Duration(ts.Nano()), nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("CPU time of process %d: %w", pid, err)
	}
	return statCPU(b)
}

// statCPU is utime plus stime of a /proc/PID/stat line. The command name,
// in parentheses, may hold spaces and parentheses itself, so the fields
// are counted from its last closing parenthesis: utime and stime are the
// stat line's 14th and 15th fields, the 12th and 13th after it.
func statCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	f := bytes.Fields(stat[i+1:])
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("unreadable /proc stat line %.40q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unreadable /proc stat line %.40q: %w", stat, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
