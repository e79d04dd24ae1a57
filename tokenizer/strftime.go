package tokenizer

import (
	"errors"
	"strconv"
	"time"

	"github.com/ardanlabs/jinja"
)

// transformers gives chat templates strftime_now(format):
// datetime.now().strftime(format), the local time of the process that
// renders the template, as a naive datetime. Llama 3.1 to 3.3 (and Llama
// 4, Granite, Mistral Small) write today's date into the system header
// with it ("Today Date: 26 Jul 2024"), so a vLLM server's prompt, and the
// tokens the router computes for it, change with the day.
//
// The Go engine's own strftime_now converts the format to a Go layout with
// a string replacer, so a format's literal text that spells a layout
// element is formatted ("%d (1)" writes the month for the "1"), and the
// directives it does not know (%y, %j, %e, glibc's %-d) are written as
// they are. strftimeNow formats the directives itself, as CPython does
// on glibc in the C locale, at the instant the render is given
// (ChatOptions.Now), and render passes it as the template's
// strftime_now.

// strftimeName is the variable render gives strftime_now as (the name
// itself: a variable shadows the Go engine's global of that name).
const strftimeName = "strftime_now"

// strftimeNow is strftime_now formatting now.
func strftimeNow(now time.Time) jinja.Value {
	return jinja.NewCallable(strftimeName, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		f, ok := kwargs["format"]
		if len(args) > 0 {
			f, ok = args[0], true
		}
		if !ok {
			return jinja.Undefined(), errors.New("strftime_now: no format")
		}
		if !f.IsString() {
			return jinja.Undefined(), errors.New("strftime_now: the format is not a string")
		}
		return jinja.NewString(pyStrftime(now, f.AsString())), nil
	})
}

var (
	weekdays = [...]string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	months   = [...]string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// pyStrftime formats t as Python's datetime.strftime(format) formats a
// naive datetime (what datetime.now() returns) on glibc in the C locale:
// %z and %Z are empty, %f is the microseconds, and glibc's directives and
// flags ("-": no padding, "_": space padding, "0": zero padding) work; a
// directive glibc does not know is written as it is.
func pyStrftime(t time.Time, format string) string {
	b := make([]byte, 0, len(format)+16)
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b = append(b, c)
			continue
		}
		start := i
		i++
		pad := byte(0) // the directive's own
		if f := format[i]; (f == '-' || f == '_' || f == '0') && i+1 < len(format) {
			pad = f
			i++
		}
		num := func(n, width int, defPad byte) {
			p := defPad
			if pad != 0 {
				p = pad
			}
			s := strconv.Itoa(n)
			if p != '-' {
				for range width - len(s) {
					if p == '_' || p == ' ' {
						b = append(b, ' ')
					} else {
						b = append(b, '0')
					}
				}
			}
			b = append(b, s...)
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case '%':
			b = append(b, '%')
		case 'a':
			b = append(b, weekdays[t.Weekday()][:3]...)
		case 'A':
			b = append(b, weekdays[t.Weekday()]...)
		case 'b', 'h':
			b = append(b, months[t.Month()-1][:3]...)
		case 'B':
			b = append(b, months[t.Month()-1]...)
		case 'c': // the C locale's: Thu Sep  5 13:04:05 2024
			b = append(b, pyStrftime(t, "%a %b %e %H:%M:%S %Y")...)
		case 'C':
			num(t.Year()/100, 2, '0')
		case 'd':
			num(t.Day(), 2, '0')
		case 'D', 'x':
			b = append(b, pyStrftime(t, "%m/%d/%y")...)
		case 'e':
			num(t.Day(), 2, '_')
		case 'f':
			num(t.Nanosecond()/1000, 6, '0')
		case 'F':
			b = append(b, pyStrftime(t, "%Y-%m-%d")...)
		case 'H':
			num(t.Hour(), 2, '0')
		case 'I':
			num(hour12, 2, '0')
		case 'j':
			num(t.YearDay(), 3, '0')
		case 'k':
			num(t.Hour(), 2, '_')
		case 'l':
			num(hour12, 2, '_')
		case 'm':
			num(int(t.Month()), 2, '0')
		case 'M':
			num(t.Minute(), 2, '0')
		case 'n':
			b = append(b, '\n')
		case 'p':
			if t.Hour() < 12 {
				b = append(b, "AM"...)
			} else {
				b = append(b, "PM"...)
			}
		case 'P':
			if t.Hour() < 12 {
				b = append(b, "am"...)
			} else {
				b = append(b, "pm"...)
			}
		case 'R':
			b = append(b, pyStrftime(t, "%H:%M")...)
		case 'S':
			num(t.Second(), 2, '0')
		case 't':
			b = append(b, '\t')
		case 'T', 'X':
			b = append(b, pyStrftime(t, "%H:%M:%S")...)
		case 'u':
			num((int(t.Weekday())+6)%7+1, 1, '0')
		case 'w':
			num(int(t.Weekday()), 1, '0')
		case 'y':
			num(t.Year()%100, 2, '0')
		case 'Y':
			num(t.Year(), 1, '0')
		case 'z', 'Z': // a naive datetime has no zone
		case 'U': // the week of the year, weeks starting on Sunday
			num((t.YearDay()+6-int(t.Weekday()))/7, 2, '0')
		case 'W': // weeks starting on Monday
			num((t.YearDay()+6-(int(t.Weekday())+6)%7)/7, 2, '0')
		case 'G', 'g', 'V':
			y, w := t.ISOWeek()
			switch format[i] {
			case 'G':
				num(y, 1, '0')
			case 'g':
				num(y%100, 2, '0')
			default:
				num(w, 2, '0')
			}
		default:
			b = append(b, format[start:i+1]...)
		}
	}
	return string(b)
}
