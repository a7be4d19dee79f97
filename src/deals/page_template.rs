//! A deal's own waiting page (`waiting_room.page_template`): the operator's HTML, with
//! placeholders (`{{position}}`, `{{eta}}`, …) for the parts the page's script keeps live.
//!
//! Checked when the deal is created, so a broken page is refused then (400, naming the
//! placeholder) rather than shown to a crowd: every `{{` must open a known placeholder
//! closed by `}}`, and the template is bounded in size. The gateway serves it in place of
//! the standard page (`http::wait_page`), each placeholder becoming an element the script
//! fills, and adds the script itself.

/// Longest `waiting_room.page_template`, in bytes: a page, not a site (styles and images
/// by URL), and with the rest of the deal within the default `server.body_bytes_max`.
pub const PAGE_TEMPLATE_BYTES_MAX: usize = 12_288;

/// The placeholders a template may use, and what the script shows in each.
pub const PLACEHOLDERS: [(&str, &str); 11] = [
    (
        "status",
        "what is happening, in words (announced to screen readers)",
    ),
    ("position", "the buyer's place in line"),
    ("ahead", "people ahead of the buyer"),
    ("eta", "the estimated wait, in words"),
    ("units_left", "units not yet promised to a pass"),
    (
        "odds",
        "the chance a unit is left at the buyer's turn, in words",
    ),
    (
        "progress",
        "how far the buyer has come since joining, in words",
    ),
    ("countdown", "while admitted: the time left on the pass"),
    (
        "pass",
        "while admitted to a deal without a checkout URL: the pass to order with",
    ),
    ("title", "`waiting_room.page_title`"),
    ("lang", "the language the page speaks (for `<html lang>`)"),
];

/// A part of a template: text as written, or a placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

/// Splits `template` into text and placeholders; the message of an error names the
/// offending placeholder.
pub fn parse(template: &str) -> Result<Vec<Part<'_>>, String> {
    if template.len() > PAGE_TEMPLATE_BYTES_MAX {
        return Err(format!(
            "waiting_room.page_template must be at most {PAGE_TEMPLATE_BYTES_MAX} bytes"
        ));
    }
    if template.contains('\0') {
        return Err("waiting_room.page_template must not hold a NUL character".into());
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        parts.push(Part::Text(&rest[..open]));
        let after = &rest[open + 2..];
        let close = after.find("}}").filter(|end| !after[..*end].contains("{{"));
        let Some(end) = close else {
            let shown: String = rest[open..].chars().take(40).collect();
            return Err(format!(
                "waiting_room.page_template has a broken placeholder: `{shown}` is not closed by `}}}}`"
            ));
        };
        let name = &after[..end];
        if !PLACEHOLDERS.iter().any(|(known, _)| *known == name) {
            let known: Vec<&str> = PLACEHOLDERS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "waiting_room.page_template has an unknown placeholder `{{{{{name}}}}}`; known: {}",
                known.join(", ")
            ));
        }
        parts.push(Part::Placeholder(name));
        rest = &after[end + 2..];
    }
    parts.push(Part::Text(rest));
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_split_from_the_text() {
        let parts = parse("<p>{{position}} of {{ahead}}</p>").unwrap();
        assert_eq!(
            parts,
            vec![
                Part::Text("<p>"),
                Part::Placeholder("position"),
                Part::Text(" of "),
                Part::Placeholder("ahead"),
                Part::Text("</p>"),
            ]
        );
        assert_eq!(
            parse("a { b { c }}").unwrap(),
            vec![Part::Text("a { b { c }}")]
        );
    }

    #[test]
    fn broken_unknown_and_oversized_templates_are_refused_naming_the_fault() {
        let error = parse("<p>{{positon}}</p>").unwrap_err();
        assert!(
            error.contains("unknown placeholder `{{positon}}`"),
            "{error}"
        );
        let error = parse("<p>{{ position }}</p>").unwrap_err();
        assert!(error.contains("`{{ position }}`"), "{error}");
        let error = parse("<p>{{position</p>").unwrap_err();
        assert!(
            error.contains("broken placeholder: `{{position</p>`"),
            "{error}"
        );
        let error = parse("{{eta {{position}}").unwrap_err();
        assert!(error.contains("broken placeholder"), "{error}");
        let big = "x".repeat(PAGE_TEMPLATE_BYTES_MAX + 1);
        assert!(parse(&big).unwrap_err().contains("12288 bytes"));
        assert!(parse(&big[1..]).is_ok());
    }
}
