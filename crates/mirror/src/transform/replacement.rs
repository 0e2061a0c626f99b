//! Java's replacement strings (`Matcher.appendReplacement`, as RegexRouter uses them): `$n`
//! refers to a group, taking more digits only while the number stays a valid group (so `$10`
//! with two groups is group 1 then `0`, where the `regex` crate would look for group 10), `${name}`
//! to a named group, and `\x` is a literal `x`. Parsed once against the pattern's groups.

use regex::{Captures, Regex};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Group(usize),
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replacement(Vec<Piece>);

impl Replacement {
    /// Parses `text` for `regex`; the error says what Java would refuse.
    pub(crate) fn parse(text: &str, regex: &Regex) -> Result<Replacement, String> {
        let groups = regex.captures_len() - 1;
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e) => lit.push(e),
                    None => return Err("ends with '\\': the character to escape is missing".into()),
                },
                '$' => {
                    let piece = match chars.peek() {
                        Some('{') => {
                            chars.next();
                            let mut name = String::new();
                            loop {
                                match chars.next() {
                                    Some('}') => break,
                                    Some(c) if c.is_ascii_alphanumeric() => name.push(c),
                                    _ => {
                                        return Err("a '${' group name must be letters and digits closed by '}'".into())
                                    }
                                }
                            }
                            if regex.capture_names().flatten().all(|n| n != name) {
                                return Err(format!("there is no group named '{name}'"));
                            }
                            Piece::Named(name)
                        }
                        Some(d) if d.is_ascii_digit() => {
                            let mut n = d.to_digit(10).unwrap_or(0) as usize;
                            chars.next();
                            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                                let more = n * 10 + d as usize;
                                if more > groups {
                                    break;
                                }
                                n = more;
                                chars.next();
                            }
                            if n > groups {
                                return Err(format!(
                                    "refers to group {n}, but the regex has {groups} group(s)"
                                ));
                            }
                            Piece::Group(n)
                        }
                        _ => {
                            return Err(
                                "'$' must be followed by a group number or {name}; write '\\$' for a literal '$'"
                                    .into(),
                            )
                        }
                    };
                    if !lit.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut lit)));
                    }
                    pieces.push(piece);
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Literal(lit));
        }
        Ok(Replacement(pieces))
    }

    pub(super) fn expand(&self, caps: &Captures<'_>) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Literal(s) => out.push_str(s),
                Piece::Group(n) => out.push_str(caps.get(*n).map_or("", |m| m.as_str())),
                Piece::Named(n) => out.push_str(caps.name(n).map_or("", |m| m.as_str())),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(re: &str, rep: &str, input: &str) -> Result<String, String> {
        let regex = Regex::new(&format!("^(?:{re})$")).unwrap();
        let r = Replacement::parse(rep, &regex)?;
        Ok(r.expand(&regex.captures(input).unwrap()))
    }

    #[test]
    fn group_numbers_take_digits_only_while_the_group_exists() {
        assert_eq!(run("(a)(b)", "$10", "ab").unwrap(), "a0");
        assert_eq!(run("(a)(b)", "$2$1", "ab").unwrap(), "ba");
        assert_eq!(
            run("(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)", "$10", "abcdefghij").unwrap(),
            "j"
        );
        assert_eq!(
            run("(?P<env>\\w+)-x", "${env}.y", "prod-x").unwrap(),
            "prod.y"
        );
        assert_eq!(run("(a)", "\\$1\\\\", "a").unwrap(), "$1\\");
        assert_eq!(run(".*", "fixed", "anything").unwrap(), "fixed");
    }

    #[test]
    fn what_java_refuses_is_refused() {
        assert!(run("(a)", "$2", "a").unwrap_err().contains("group 2"));
        assert!(run("(a)", "$x", "a").unwrap_err().contains("'$'"));
        assert!(run("(a)", "x\\", "a").unwrap_err().contains("escape"));
        assert!(run("(a)", "${nope}", "a").unwrap_err().contains("nope"));
    }
}
