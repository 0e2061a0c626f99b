//! Java regular expressions, translated into the `regex` crate's syntax with Java's meaning.
//!
//! MM2's `topics`, `groups` and their exclude lists are Java regexes (mm2-compatibility §1.6). The `regex`
//! crate reads most of them the same way, but not all: some constructs it rejects (look-around,
//! back-references), and some it accepts with another meaning — `\w`, `\d`, `\s` and POSIX
//! `\p{Alpha}` are ASCII in Java and Unicode in Rust, `.` in Java also stops at `\r`, `\u0085`,
//! `\u2028` and `\u2029`, `[[:alpha:]]` is a POSIX class in Rust and a plain set of characters in
//! Java, `(?U)` and possessive quantifiers mean different things. This module walks the Java
//! pattern once and writes a Rust pattern with the Java meaning, or rejects a construct it cannot
//! express with an error that names it and its position. It never lets a pattern match
//! differently in silence.
//!
//! Why one file of this size: it is one recursive-descent translator over one cursor and scoped
//! state (DOTALL per group, class depth, `can_repeat`), and most of its length is the table of
//! Java/Rust differences in `escape` and `property`, used both inside and outside classes. Next
//! to split out: `escape` and `property` into a child module.

use std::fmt;
mod escapes;

/// A Java construct kmirror cannot express, or a pattern that is invalid in Java.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaRegexError {
    /// 0-based character position in the pattern.
    pub position: usize,
    pub message: String,
}

impl fmt::Display for JavaRegexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at position {}: {}", self.position, self.message)
    }
}

/// Java's `.` (without DOTALL) excludes every line terminator, not only `\n`.
const JAVA_DOT: &str = r"[^\n\r\x{85}\x{2028}\x{2029}]";

/// Translates a Java regex into an equivalent `regex`-crate pattern (not anchored).
pub fn translate(pattern: &str) -> Result<String, JavaRegexError> {
    translate_with_notes(pattern).map(|(s, _)| s)
}

/// What a caller should tell the user about a translated pattern.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Notes {
    /// `(?i)` without `u`: Java folds only ASCII letters; kmirror's engine also folds non-ASCII
    /// ones (`é`/`É`, the Kelvin sign and `k`). Identical for ASCII names (all topic names).
    pub ascii_case_insensitive: bool,
    /// A `$` with more pattern after it: Java's `$` (without MULTILINE) also matches before a
    /// line terminator that ends the name; kmirror's only at the end. Identical for names
    /// without line breaks (every topic name; Kafka refuses them there).
    pub end_before_terminator: bool,
}

/// [`translate`], plus notes on differences that cannot be expressed.
pub fn translate_with_notes(pattern: &str) -> Result<(String, Notes), JavaRegexError> {
    let mut t = Translator {
        chars: pattern.chars().collect(),
        pos: 0,
        out: String::with_capacity(pattern.len() + 16),
        dotall: vec![false],
        notes: Notes::default(),
        class_depth: 0,
        can_repeat: false,
        group_names: Default::default(),
    };
    t.run()?;
    Ok((t.out, t.notes))
}

struct Translator {
    chars: Vec<char>,
    pos: usize,
    out: String,
    /// DOTALL flag per open group (Java scopes inline flags to the enclosing group).
    dotall: Vec<bool>,
    notes: Notes,
    /// Character classes open around the one being read (each nested `[` recurses).
    class_depth: usize,
    /// Whether what was written last can take a quantifier (not at the start, nor right after
    /// `(`, `|` or an inline flag group).
    can_repeat: bool,
    /// Names of the named groups so far (Java refuses a name used twice, so does `regex`).
    group_names: std::collections::HashSet<String>,
}

/// Deeper nesting of character classes than any real topic or group filter needs; a pattern
/// from a config file must not be able to exhaust the stack.
const MAX_CLASS_DEPTH: usize = 32;

fn err<T>(position: usize, message: impl Into<String>) -> Result<T, JavaRegexError> {
    Err(JavaRegexError {
        position,
        message: message.into(),
    })
}

/// What one escape stands for.
enum Escaped {
    /// A single character (usable as a range end inside a class).
    Char(char),
    /// A class or assertion, already in Rust syntax.
    Class(String),
    /// `\Q...\E`: a literal string.
    Quoted(String),
}

impl Translator {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn run(&mut self) -> Result<(), JavaRegexError> {
        while let Some(c) = self.peek() {
            let at = self.pos;
            self.pos += 1;
            if matches!(c, '*' | '+' | '?' | '{') && !self.can_repeat {
                return err(
                    at,
                    format!("dangling '{c}': nothing before it to repeat (Java refuses it too)"),
                );
            }
            // What this character leaves behind: something to repeat, or not.
            self.can_repeat = !matches!(c, '(' | '|');
            match c {
                '\\' => match self.escape(false, at)? {
                    Escaped::Char(ch) => push_literal(&mut self.out, ch),
                    Escaped::Class(s) => self.out.push_str(&s),
                    Escaped::Quoted(s) => s.chars().for_each(|ch| push_literal(&mut self.out, ch)),
                },
                '[' => {
                    let class = self.class(at)?;
                    self.out.push_str(&class);
                }
                '.' => {
                    if *self.dotall.last().unwrap_or(&false) {
                        self.out.push_str("(?s:.)");
                    } else {
                        self.out.push_str(JAVA_DOT);
                    }
                }
                '(' => self.group(at)?,
                ')' => {
                    if self.dotall.len() <= 1 {
                        return err(at, "unmatched closing ')'");
                    }
                    self.dotall.pop();
                    self.out.push(')');
                }
                '*' | '+' | '?' => {
                    self.out.push(c);
                    self.quantifier_suffix()?;
                    self.after_quantifier()?;
                }
                '{' => {
                    let q = self.repetition(at)?;
                    self.out.push_str(&q);
                    self.quantifier_suffix()?;
                    self.after_quantifier()?;
                }
                '$' => {
                    self.out.push('$');
                    if !self.ends_here() {
                        self.notes.end_before_terminator = true;
                    }
                }
                '^' | '|' => self.out.push(c),
                other => push_literal(&mut self.out, other),
            }
        }
        if self.dotall.len() > 1 {
            return err(
                self.chars.len(),
                "unclosed group: a '(' has no matching ')'",
            );
        }
        Ok(())
    }

    /// After a quantifier: `?` makes it lazy (same in both), `+` makes it possessive (Java only).
    fn quantifier_suffix(&mut self) -> Result<(), JavaRegexError> {
        match self.peek() {
            Some('?') => {
                self.pos += 1;
                self.out.push('?');
            }
            Some('+') => {
                return err(
                    self.pos,
                    "possessive quantifiers ('*+', '++', '?+', '{n}+') are not supported; \
                     use the greedy form, which matches the same names in a full-name match \
                     unless the pattern relies on not backtracking",
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// What Java does after a complete quantifier (with its `?` or `+`): a repetition `{..}`
    /// there is checked and then ignored, with its own suffix (`a{1,2}{5}` is `a{1,2}`;
    /// `java.util.regex` quirk, verified against Java 17); `*`, `+` or `?` there is an error
    /// ("dangling meta character"). The `regex` crate would apply both, so neither may pass
    /// through.
    fn after_quantifier(&mut self) -> Result<(), JavaRegexError> {
        loop {
            match self.peek() {
                Some('{') => {
                    let at = self.pos;
                    self.pos += 1;
                    self.repetition(at)?;
                    if matches!(self.peek(), Some('?' | '+')) {
                        self.pos += 1;
                    }
                }
                Some(c @ ('*' | '+' | '?')) => {
                    return err(
                        self.pos,
                        format!("dangling '{c}': a quantifier cannot follow a quantifier (Java refuses it; use a group)"),
                    )
                }
                _ => return Ok(()),
            }
        }
    }

    /// Whether nothing that could consume a character follows (only quantifiers, `$` and
    /// closing groups up to the end). Java's `$` also matches before a final line terminator;
    /// in a full-name match that makes a difference only when more pattern follows.
    fn ends_here(&self) -> bool {
        self.chars[self.pos..]
            .iter()
            .all(|c| matches!(c, ')' | '$' | '*' | '+' | '?'))
    }

    /// `{n}`, `{n,}` or `{n,m}` (Java has no `{,m}`).
    fn repetition(&mut self, at: usize) -> Result<String, JavaRegexError> {
        let mut body = String::new();
        while let Some(c) = self.peek() {
            self.pos += 1;
            if c == '}' {
                let ok = match body.split_once(',') {
                    None => !body.is_empty() && body.chars().all(|d| d.is_ascii_digit()),
                    Some((lo, hi)) => {
                        !lo.is_empty()
                            && lo.chars().all(|d| d.is_ascii_digit())
                            && hi.chars().all(|d| d.is_ascii_digit())
                    }
                };
                if !ok {
                    return err(at, format!("illegal repetition '{{{body}}}' (Java accepts {{n}}, {{n,}} and {{n,m}}; write '\\{{' for a literal brace)"));
                }
                // Java counts in an int and refuses a count beyond it (found by fuzzing: the
                // regex crate refused the translation of a 90-digit count).
                let counts: Vec<&str> = body.split(',').filter(|n| !n.is_empty()).collect();
                if counts.iter().any(|n| n.parse::<i32>().is_err()) {
                    return err(
                        at,
                        format!(
                            "illegal repetition range '{{{body}}}': a count exceeds 2147483647"
                        ),
                    );
                }
                // Checked here too: a repetition after a quantifier is dropped (see
                // after_quantifier), but Java still refuses a reversed range there.
                if let Some((lo, hi)) = body.split_once(',') {
                    let (lo, hi) = (lo.parse::<u64>().ok(), hi.parse::<u64>().ok());
                    if let (Some(lo), Some(hi)) = (lo, hi) {
                        if lo > hi {
                            return err(at, format!("illegal repetition range '{{{body}}}': the minimum exceeds the maximum"));
                        }
                    }
                }
                return Ok(format!("{{{body}}}"));
            }
            body.push(c);
        }
        err(
            at,
            "illegal repetition: '{' is not closed (write '\\{' for a literal brace)",
        )
    }

    fn group(&mut self, at: usize) -> Result<(), JavaRegexError> {
        let inherited = *self.dotall.last().unwrap_or(&false);
        if self.peek() != Some('?') {
            self.dotall.push(inherited);
            self.out.push('(');
            return Ok(());
        }
        self.pos += 1;
        match (self.peek(), self.peek_at(1)) {
            (Some(':'), _) => {
                self.pos += 1;
                self.dotall.push(inherited);
                self.out.push_str("(?:");
                Ok(())
            }
            (Some('='), _) | (Some('!'), _) | (Some('<'), Some('=')) | (Some('<'), Some('!')) => {
                err(at, "look-around ('(?=', '(?!', '(?<=', '(?<!') is not supported by kmirror's regex engine")
            }
            (Some('>'), _) => err(at, "atomic groups '(?>...)' are not supported by kmirror's regex engine"),
            (Some('<'), _) => {
                self.pos += 1;
                let mut name = String::new();
                while let Some(c) = self.peek() {
                    self.pos += 1;
                    if c == '>' {
                        let valid = name.chars().next().is_some_and(|f| f.is_ascii_alphabetic())
                            && name.chars().all(|c| c.is_ascii_alphanumeric());
                        if !valid {
                            return err(at, format!("invalid group name '{name}' (Java: a letter, then letters or digits)"));
                        }
                        if !self.group_names.insert(name.clone()) {
                            return err(at, format!("named group '{name}' is defined twice"));
                        }
                        self.dotall.push(inherited);
                        self.out.push_str(&format!("(?<{name}>"));
                        return Ok(());
                    }
                    name.push(c);
                }
                err(at, "named group is not closed with '>'")
            }
            _ => self.flags(at, inherited),
        }
    }

    /// `(?flags)` or `(?flags:...)`.
    fn flags(&mut self, at: usize, inherited: bool) -> Result<(), JavaRegexError> {
        let mut on = true;
        // Each flag's final state: Java applies them in order (`(?ii)` and `(?i-i)` are valid
        // there), the regex crate refuses a flag named twice.
        let (mut case, mut dot): (Option<bool>, Option<bool>) = (None, None);
        let mut dotall = inherited;
        let (mut case_on, mut unicode_case) = (false, false);
        loop {
            let Some(c) = self.peek() else {
                return err(at, "unclosed inline flag group '(?'");
            };
            self.pos += 1;
            match c {
                '-' if on => on = false,
                '-' => return err(self.pos - 1, "a second '-' in an inline flag group"),
                'i' => {
                    case_on |= on;
                    case = Some(on);
                }
                's' => {
                    dotall = on;
                    dot = Some(on);
                }
                // UNICODE_CASE: with `i`, Java folds case by Unicode rules, as Rust always does.
                'u' => unicode_case = true,
                ')' | ':' => {
                    if case_on && !unicode_case {
                        self.notes.ascii_case_insensitive = true;
                    }
                    let named = [('i', case), ('s', dot)];
                    let set: String = named.iter().filter(|f| f.1 == Some(true)).map(|f| f.0).collect();
                    let cleared: String = named.iter().filter(|f| f.1 == Some(false)).map(|f| f.0).collect();
                    let flags = if cleared.is_empty() {
                        set
                    } else {
                        format!("{set}-{cleared}")
                    };
                    if c == ')' {
                        // Applies to the rest of the enclosing group.
                        if let Some(top) = self.dotall.last_mut() {
                            *top = dotall;
                        }
                        if !flags.is_empty() {
                            self.out.push_str(&format!("(?{flags})"));
                        }
                    } else {
                        self.dotall.push(dotall);
                        self.out.push_str(&format!("(?{flags}:"));
                    }
                    return Ok(());
                }
                'm' => return err(self.pos - 1, "the MULTILINE flag '(?m)' is not supported (Java and kmirror's engine disagree on line terminators); topic and group names have no lines"),
                'd' => return err(self.pos - 1, "the UNIX_LINES flag '(?d)' is not supported"),
                'x' => return err(self.pos - 1, "the COMMENTS flag '(?x)' is not supported; remove whitespace and comments from the pattern"),
                'U' => return err(self.pos - 1, "the UNICODE_CHARACTER_CLASS flag '(?U)' is not supported (in kmirror's engine '(?U)' would mean 'swap greedy and lazy'); use \\p{L} or \\p{N} for Unicode letters and digits"),
                'P' => return err(at, "'(?P<name>...)' is not Java syntax; use '(?<name>...)'"),
                other => return err(self.pos - 1, format!("unknown inline flag '{other}'")),
            }
        }
    }

    /// A character class, from just after `[` up to its `]`, with nested classes, ranges and
    /// `&&` intersections.
    fn class(&mut self, at: usize) -> Result<String, JavaRegexError> {
        let mut out = String::from("[");
        if self.peek() == Some('^') {
            self.pos += 1;
            out.push('^');
        }
        // Java takes a ']' right after '[' or '[^' literally, as Rust does; spell it escaped.
        if self.peek() == Some(']') {
            self.pos += 1;
            out.push_str(r"\]");
        }
        // The last single character written, which a following '-' may turn into a range.
        let mut last_single: Option<char> = None;
        loop {
            let Some(c) = self.peek() else {
                return err(at, "unclosed character class: '[' has no matching ']'");
            };
            let here = self.pos;
            self.pos += 1;
            match c {
                ']' => {
                    out.push(']');
                    return Ok(out);
                }
                '[' => {
                    if self.class_depth >= MAX_CLASS_DEPTH {
                        return err(
                            here,
                            format!("character classes nested more than {MAX_CLASS_DEPTH} deep"),
                        );
                    }
                    self.class_depth += 1;
                    let nested = self.class(here);
                    self.class_depth -= 1;
                    out.push_str(&nested?);
                    last_single = None;
                }
                '&' if self.peek() == Some('&') => {
                    self.pos += 1;
                    out.push_str("&&");
                    last_single = None;
                }
                '-' if last_single.is_some()
                    && self
                        .peek()
                        .is_some_and(|n| n != ']' && n != '[' && n != '&') =>
                {
                    let end_at = self.pos;
                    let end = match self.peek() {
                        Some('\\') => {
                            self.pos += 1;
                            match self.escape(true, end_at)? {
                                Escaped::Char(ch) => ch,
                                _ => return err(end_at, "a range must end in a single character"),
                            }
                        }
                        Some(ch) => {
                            self.pos += 1;
                            ch
                        }
                        None => unreachable!("checked by the guard"),
                    };
                    if let Some(start) = last_single.filter(|s| end < *s) {
                        return err(
                            end_at,
                            format!("illegal character range '{start}-{end}': the end comes before the start"),
                        );
                    }
                    out.push('-');
                    push_class_literal(&mut out, end);
                    last_single = None;
                }
                '\\' => match self.escape(true, here)? {
                    Escaped::Char(ch) => {
                        push_class_literal(&mut out, ch);
                        last_single = Some(ch);
                    }
                    Escaped::Class(s) => {
                        out.push_str(&s);
                        last_single = None;
                    }
                    Escaped::Quoted(s) => {
                        s.chars().for_each(|ch| push_class_literal(&mut out, ch));
                        last_single = s.chars().last();
                    }
                },
                other => {
                    push_class_literal(&mut out, other);
                    last_single = Some(other);
                }
            }
        }
    }
}

/// Writes one literal character outside a class.
fn push_literal(out: &mut String, c: char) {
    out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
}

/// Writes one literal character inside a class, escaping what Rust's class syntax treats
/// specially (`[`, `]`, `\`, `-`, `^`, `&`, `~`, and `:` so that `[:x:]` is never POSIX).
fn push_class_literal(out: &mut String, c: char) {
    if matches!(c, '[' | ']' | '\\' | '-' | '^' | '&' | '~' | ':') {
        out.push('\\');
        out.push(c);
    } else if c.is_control() || c == ' ' {
        out.push_str(&format!("\\x{{{:x}}}", c as u32));
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    /// Full-name match, as Java's `Matcher.matches()`.
    fn matches(java: &str, name: &str) -> bool {
        let rust = translate(java).unwrap_or_else(|e| panic!("{java}: {e}"));
        Regex::new(&format!("^(?:{rust})$"))
            .unwrap_or_else(|e| panic!("{java} -> {rust}: {e}"))
            .is_match(name)
    }

    #[test]
    fn java_semantics_table() {
        // (pattern, name, does Java's Pattern.matches say yes?)
        let cases: &[(&str, &str, bool)] = &[
            (".*", "anything", true),
            ("topic-.*", "topic-1", true),
            ("topic-.*", "my-topic-1", false),
            ("projects.*", "projects.alpha", true),
            (r".*[\-\.]internal", "mm2-offsets.A.internal", true),
            (r".*\.replica", "x.replica", true),
            ("__.*", "__consumer_offsets", true),
            (r"\w+", "grüße", false),
            (r"\w+", "abc_123", true),
            (r"\d+", "\u{0661}\u{0662}", false),
            (r"\d+", "12", true),
            (r"\s", "\u{a0}", false),
            (r"\p{Alpha}+", "é", false),
            (r"\p{Alpha}+", "abc", true),
            (r"\p{L}+", "é", true),
            (r"\p{IsL}+", "é", true),
            (r"\P{Digit}", "a", true),
            (r"[\w-]+", "a-b_c", true),
            (r"[\w&&[^_]]+", "a_b", false),
            (r"[a-z&&[^aeiou]]+", "bcd", true),
            (r"[a-z&&[^aeiou]]+", "bad", false),
            ("[[:alpha:]]", "a", true),
            ("[[:alpha:]]", ":", true),
            ("[[:alpha:]]", "b", false),
            ("a.b", "a\rb", false),
            ("a.b", "a\u{2028}b", false),
            ("a.b", "axb", true),
            ("(?s)a.b", "a\nb", true),
            ("(?s:a.)b|c.", "a\nb", true),
            ("(?s:a.)b|c.", "c\n", false),
            ("(?i)orders", "ORDERS", true),
            ("(?i:a)b", "AB", false),
            (r"\Qa.b\E", "a.b", true),
            (r"\Qa.b\E", "axb", false),
            (r"[\Q.-\E]+", ".-.", true),
            (r"a\.b", "a.b", true),
            (r"\x41\u0042\0103", "ABC", true),
            (r"\x{1F600}", "\u{1F600}", true),
            (r"\uD83D\uDE00", "\u{1F600}", true),
            (r"a{2}", "aa", true),
            (r"a{2,}", "aaa", true),
            (r"a{1,2}?", "aa", true),
            ("[]a]+", "]a", true),
            ("[^]a]", "b", true),
            ("[a-]+", "a-", true),
            (r"[\d-z]+", "1-z", true),
            ("[~~]", "~", true),
            ("a&b", "a&b", true),
            ("x#y z", "x#y z", true),
            (r"\bfoo\b", "foo", true),
            ("(?<name>ab)c", "abc", true),
            (r"\e", "\x1b", true),
            (r"\cA", "\x01", true),
            // Java drops a repetition that follows a quantifier (checked against Java 17).
            ("a{1,2}{5}", "aa", true),
            ("a{1,2}{5}", "aaaaa", false),
            ("a*{2}+", "aaa", true),
            ("a{2}?{3}", "aa", true),
            ("(a){2}{3}", "aaa", false),
            ("a$|b", "a", true),
            // Java applies inline flags in order; the last one named wins.
            ("(?ii)a", "A", true),
            ("(?i-i)a", "A", false),
            ("(?-i)(?i)a", "A", true),
        ];
        for (java, name, expected) in cases {
            assert_eq!(
                matches(java, name),
                *expected,
                "pattern {java:?} on {name:?} (translated: {:?})",
                translate(java)
            );
        }
    }

    #[test]
    fn deeply_nested_classes_are_refused_not_a_stack_overflow() {
        let deep = format!("{}a{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = translate(&deep).unwrap_err();
        assert!(e.message.contains("nested more than 32 deep"), "{e}");
        assert_eq!(e.position, MAX_CLASS_DEPTH + 1, "the first '[' too deep");
        let fine = format!("{}a{}", "[".repeat(8), "]".repeat(8));
        assert!(matches(&fine, "a"));
    }

    #[test]
    fn rejected_constructs_name_what_and_where() {
        let cases: &[(&str, usize, &str)] = &[
            ("a(?=b)", 1, "look-around"),
            ("(?!x).*", 0, "look-around"),
            ("(?<=a)b", 0, "look-around"),
            ("(?<!a)b", 0, "look-around"),
            (r"(a)\1", 3, "back-references"),
            (r"(?<n>a)\k<n>", 7, "back-references"),
            ("(?>ab)", 0, "atomic"),
            ("a++", 2, "possessive"),
            ("a*+b", 2, "possessive"),
            ("a{2}+", 4, "possessive"),
            ("(?U)a", 2, "UNICODE_CHARACTER_CLASS"),
            ("(?m)^a$", 2, "MULTILINE"),
            ("(?x)a b", 2, "COMMENTS"),
            ("(?P<n>a)", 0, "not Java syntax"),
            (r"\p{javaLowerCase}", 0, "java.lang.Character"),
            (r"\p{InGreek}", 0, "blocks"),
            (r"\p{alpha}", 0, "case-sensitive"),
            (r"\Z", 0, "\\Z"),
            (r"\G", 0, "\\G"),
            (r"\R", 0, "\\R"),
            (r"\y", 0, "illegal escape"),
            ("a{,2}", 1, "illegal repetition"),
            ("a{x}", 1, "illegal repetition"),
            ("a{3,2}", 1, "minimum exceeds"),
            ("a{2147483648}", 1, "exceeds 2147483647"),
            ("[a[^b]]{25666666666666666666666,}", 7, "exceeds 2147483647"),
            ("[z-u]", 3, "illegal character range"),
            ("(?i-s-i)a", 5, "second '-'"),
            ("(?<n>a)(?<n>b)", 7, "defined twice"),
            ("[a\\Qz\\E-u]", 8, "illegal character range"),
            ("*a", 0, "nothing before it"),
            ("(+a)", 1, "nothing before it"),
            ("a|?", 2, "nothing before it"),
            ("(?i)*", 4, "nothing before it"),
            ("(?:{2})", 3, "nothing before it"),
            ("a*{3,2}", 2, "minimum exceeds"),
            ("a**", 2, "dangling '*'"),
            ("a{2}?+", 5, "dangling '+'"),
            ("a+{2}?*", 6, "dangling '*'"),
            ("[abc", 0, "unclosed character class"),
            ("(ab", 3, "unclosed group"),
            ("ab)", 2, "unmatched"),
            ("[\\b]", 1, "inside a character class"),
            ("abc\\", 3, "lone backslash"),
        ];
        for (java, pos, needle) in cases {
            let e = translate(java).expect_err(java);
            assert_eq!(e.position, *pos, "{java}: {e}");
            assert!(e.message.contains(needle), "{java}: {e}");
        }
    }

    #[test]
    fn mm2_default_lists_translate() {
        for p in [
            r".*[\-\.]internal",
            r".*\.replica",
            "__.*",
            "console-consumer-.*",
            "connect-.*",
        ] {
            assert!(Regex::new(&translate(p).unwrap()).is_ok(), "{p}");
        }
    }

    mod generated {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// A quoted literal matches exactly itself, whatever characters it holds.
            #[test]
            fn quoted_literals_match_only_themselves(s in "[ -~\u{e9}\u{2028}]{0,20}", other in "[a-z]{1,3}") {
                prop_assume!(!s.contains("\\E"));
                let java = format!("\\Q{s}\\E");
                prop_assert!(matches(&java, &s));
                let extra = format!("{s}{other}");
                prop_assert!(!matches(&java, &extra));
            }

            /// Every printable ASCII character, escaped Java-style, matches itself.
            #[test]
            fn escaped_punctuation_is_literal(c in "[!-/:-@\\[-`{-~]") {
                let java = format!("\\{c}");
                prop_assert!(matches(&java, &c));
                let in_class = format!("[\\{c}]");
                prop_assert!(matches(&in_class, &c));
            }
        }
    }
}
