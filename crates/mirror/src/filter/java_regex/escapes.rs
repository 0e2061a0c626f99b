//! Java's escapes as the translator reads them: character escapes, `\Q..\E` quoting,
//! predefined classes with Java's ASCII meaning, hex and Unicode code points, and `\p{..}`
//! properties (POSIX, java.lang.Character, Unicode scripts and categories).

use crate::filter::java_regex::*;

impl Translator {
    /// An escape, from just after the backslash.
    pub(crate) fn escape(&mut self, in_class: bool, at: usize) -> Result<Escaped, JavaRegexError> {
        let Some(c) = self.peek() else {
            return err(at, "the pattern ends with a lone backslash");
        };
        self.pos += 1;
        let class = |s: &str| Ok(Escaped::Class(s.to_string()));
        match c {
            't' => Ok(Escaped::Char('\t')),
            'n' => Ok(Escaped::Char('\n')),
            'r' => Ok(Escaped::Char('\r')),
            'f' => Ok(Escaped::Char('\x0c')),
            'a' => Ok(Escaped::Char('\x07')),
            'e' => Ok(Escaped::Char('\x1b')),
            '0' => {
                // \0n, \0nn, \0mnn (m <= 3): octal.
                let mut digits = String::new();
                while digits.len() < 3 && self.peek().is_some_and(|d| ('0'..='7').contains(&d)) {
                    let next = format!("{digits}{}", self.peek().unwrap_or('0'));
                    if u32::from_str_radix(&next, 8).unwrap_or(256) > 0o377 {
                        break;
                    }
                    digits = next;
                    self.pos += 1;
                }
                if digits.is_empty() {
                    return err(at, "illegal octal escape '\\0' (needs at least one octal digit)");
                }
                let v = u32::from_str_radix(&digits, 8).unwrap_or(0);
                Ok(Escaped::Char(char::from_u32(v).unwrap_or('\0')))
            }
            'x' => {
                let v = if self.peek() == Some('{') {
                    self.pos += 1;
                    let hex = self.take_while(|c| c != '}');
                    if self.peek() != Some('}') {
                        return err(at, "unclosed '\\x{'");
                    }
                    self.pos += 1;
                    u32::from_str_radix(&hex, 16).ok()
                } else {
                    let hex: String = (0..2).filter_map(|i| self.peek_at(i)).collect();
                    self.pos += hex.len();
                    if hex.len() == 2 {
                        u32::from_str_radix(&hex, 16).ok()
                    } else {
                        None
                    }
                };
                match v.and_then(char::from_u32) {
                    Some(ch) => Ok(Escaped::Char(ch)),
                    None => err(at, "illegal hexadecimal escape"),
                }
            }
            'u' => {
                let hi = self.hex4(at)?;
                let ch = if (0xD800..0xDC00).contains(&hi)
                    && self.peek() == Some('\\')
                    && self.peek_at(1) == Some('u')
                {
                    self.pos += 2;
                    let lo = self.hex4(at)?;
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00)))
                } else {
                    char::from_u32(hi)
                };
                match ch {
                    Some(ch) => Ok(Escaped::Char(ch)),
                    None => err(at, "'\\u' escape is a lone UTF-16 surrogate"),
                }
            }
            'c' => match self.peek() {
                Some(x) => {
                    self.pos += 1;
                    Ok(Escaped::Char(char::from_u32((x as u32) ^ 64).unwrap_or('\0')))
                }
                None => err(at, "'\\c' needs a control character letter"),
            },
            'd' => class("[0-9]"),
            'D' => class("[^0-9]"),
            'w' => class("[0-9A-Za-z_]"),
            'W' => class("[^0-9A-Za-z_]"),
            's' => class(r"[\t\n\x0B\x0C\r ]"),
            'S' => class(r"[^\t\n\x0B\x0C\r ]"),
            'h' => class(r"[ \t\xA0\x{1680}\x{180e}\x{2000}-\x{200a}\x{202f}\x{205f}\x{3000}]"),
            'H' => class(r"[^ \t\xA0\x{1680}\x{180e}\x{2000}-\x{200a}\x{202f}\x{205f}\x{3000}]"),
            'v' => class(r"[\n\x0B\x0C\r\x{85}\x{2028}\x{2029}]"),
            'V' => class(r"[^\n\x0B\x0C\r\x{85}\x{2028}\x{2029}]"),
            'p' | 'P' => self.property(c == 'P', at),
            'Q' => {
                let mut quoted = String::new();
                while let Some(ch) = self.peek() {
                    if ch == '\\' && self.peek_at(1) == Some('E') {
                        self.pos += 2;
                        return Ok(Escaped::Quoted(quoted));
                    }
                    quoted.push(ch);
                    self.pos += 1;
                }
                Ok(Escaped::Quoted(quoted))
            }
            _ if in_class && matches!(c, 'b' | 'B' | 'A' | 'z' | 'Z' | 'G' | 'R' | 'X') => {
                err(at, format!("'\\{c}' is not allowed inside a character class"))
            }
            // Java's \b follows \w (ASCII) since JDK 19; topic names are ASCII either way.
            'b' => class(r"(?-u:\b)"),
            'B' => class(r"(?-u:\B)"),
            'A' => class(r"\A"),
            'z' => class(r"\z"),
            'Z' => err(at, "'\\Z' (end of input before a final line terminator) is not supported; use '$' or '\\z'"),
            'G' => err(at, "'\\G' (end of the previous match) is not supported"),
            'R' => err(at, "'\\R' (any line break) is not supported"),
            'X' => err(at, "'\\X' (grapheme cluster) is not supported"),
            'N' => err(at, "'\\N{name}' (named character) is not supported; use '\\uXXXX'"),
            'k' => err(at, "back-references ('\\k<name>') are not supported by kmirror's regex engine"),
            '1'..='9' => err(at, format!("back-references ('\\{c}') are not supported by kmirror's regex engine")),
            c if c.is_ascii_alphabetic() => err(at, format!("illegal escape '\\{c}' (not defined in Java regex)")),
            c => Ok(Escaped::Char(c)),
        }
    }

    pub(crate) fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek() {
            if !f(c) {
                break;
            }
            s.push(c);
            self.pos += 1;
        }
        s
    }

    pub(crate) fn hex4(&mut self, at: usize) -> Result<u32, JavaRegexError> {
        let hex: String = (0..4).filter_map(|i| self.peek_at(i)).collect();
        if hex.len() == 4 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            self.pos += 4;
            Ok(u32::from_str_radix(&hex, 16).unwrap_or(0))
        } else {
            err(at, "'\\u' needs four hex digits")
        }
    }

    /// `\p{Name}`, `\pL`, `\P{...}`.
    pub(crate) fn property(&mut self, negated: bool, at: usize) -> Result<Escaped, JavaRegexError> {
        let name = if self.peek() == Some('{') {
            self.pos += 1;
            let n = self.take_while(|c| c != '}');
            if self.peek() != Some('}') {
                return err(at, "unclosed '\\p{'");
            }
            self.pos += 1;
            n
        } else {
            match self.peek() {
                Some(c) => {
                    self.pos += 1;
                    c.to_string()
                }
                None => return err(at, "'\\p' needs a property name"),
            }
        };
        // Java's POSIX classes are ASCII-only (without UNICODE_CHARACTER_CLASS).
        const POSIX: [(&str, &str); 13] = [
            ("Lower", "lower"),
            ("Upper", "upper"),
            ("ASCII", "ascii"),
            ("Alpha", "alpha"),
            ("Digit", "digit"),
            ("Alnum", "alnum"),
            ("Punct", "punct"),
            ("Graph", "graph"),
            ("Print", "print"),
            ("Blank", "blank"),
            ("Cntrl", "cntrl"),
            ("XDigit", "xdigit"),
            ("Space", "space"),
        ];
        if let Some((_, rust)) = POSIX.iter().find(|(java, _)| *java == name) {
            let neg = if negated { "^" } else { "" };
            return Ok(Escaped::Class(format!("[[:{neg}{rust}:]]")));
        }
        if POSIX
            .iter()
            .any(|(java, _)| java.eq_ignore_ascii_case(&name))
        {
            return err(at, format!("unknown character property '{name}' (Java's POSIX class names are case-sensitive, e.g. \\p{{Alpha}})"));
        }
        if name.starts_with("java") {
            return err(
                at,
                format!("'\\p{{{name}}}' (java.lang.Character classes) is not supported"),
            );
        }
        if name.starts_with("In") || name.starts_with("blk=") || name.starts_with("block=") {
            return err(at, format!("Unicode blocks ('\\p{{{name}}}') are not supported; use a script such as \\p{{IsGreek}}"));
        }
        // Java: `IsL`, `IsLatin`, `IsAlphabetic`, `L`, `Lu`, `sc=Latin`, `gc=Lu`.
        let rust_name = name.strip_prefix("Is").unwrap_or(&name);
        let probe = format!("\\p{{{rust_name}}}");
        if regex::Regex::new(&probe).is_err() {
            return err(
                at,
                format!("unknown or unsupported character property '{name}'"),
            );
        }
        let p = if negated { 'P' } else { 'p' };
        Ok(Escaped::Class(format!("\\{p}{{{rust_name}}}")))
    }
}
