//! The XML of AWS's Query answers as a small owned tree: elements by local
//! name (EC2 answers in a namespace, Auto Scaling and STS in another), each
//! with its text and children.

/// One element.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Xml {
    /// The local name (no namespace).
    pub name: String,
    /// The element's own text, trimmed (empty for containers).
    pub text: String,
    /// The child elements, in order.
    pub children: Vec<Xml>,
}

impl Xml {
    /// Parses a document into its root element.
    pub fn parse(text: &str) -> Result<Xml, String> {
        let doc = roxmltree::Document::parse(text).map_err(|e| e.to_string())?;
        Ok(Self::of(doc.root_element()))
    }

    fn of(node: roxmltree::Node<'_, '_>) -> Xml {
        let mut text = String::new();
        let mut children = Vec::new();
        for child in node.children() {
            if child.is_element() {
                children.push(Self::of(child));
            } else if child.is_text() {
                text.push_str(child.text().unwrap_or_default());
            }
        }
        Xml {
            name: node.tag_name().name().to_string(),
            text: text.trim().to_string(),
            children,
        }
    }

    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Xml> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The element at the end of a path of child names.
    pub fn at(&self, path: &[&str]) -> Option<&Xml> {
        path.iter().try_fold(self, |node, name| node.child(name))
    }

    /// The text at a path, when the element is there.
    pub fn text_at(&self, path: &[&str]) -> Option<String> {
        self.at(path).map(|n| n.text.clone())
    }

    /// The items of the list at a path: its children named `item` (EC2) or
    /// `member` (Auto Scaling, STS); none when the list is absent.
    pub fn items(&self, path: &[&str]) -> impl Iterator<Item = &Xml> {
        self.at(path)
            .map(|list| list.children.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|c| c.name == "item" || c.name == "member")
    }

    /// The first element named `name` anywhere below (errors: `Code`, `Message`).
    pub fn find(&self, name: &str) -> Option<&Xml> {
        self.children
            .iter()
            .find_map(|c| if c.name == name { Some(c) } else { c.find(name) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_elements_are_found_by_their_local_names() {
        let xml = Xml::parse(
            r#"<?xml version="1.0" encoding="UTF-8"?>
            <DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
              <reservationSet><item><instancesSet>
                <item><instanceId>i-1</instanceId></item>
                <item><instanceId>i-2</instanceId></item>
              </instancesSet></item></reservationSet>
            </DescribeInstancesResponse>"#,
        )
        .expect("parses");
        let ids: Vec<String> = xml
            .items(&["reservationSet"])
            .flat_map(|r| r.items(&["instancesSet"]))
            .filter_map(|i| i.text_at(&["instanceId"]))
            .collect();
        assert_eq!(ids, ["i-1", "i-2"]);
        assert!(xml.items(&["nothing"]).next().is_none());
    }

    #[test]
    fn errors_are_found_at_any_depth() {
        let xml = Xml::parse(
            "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
             <Message>Rate exceeded</Message></Error></ErrorResponse>",
        )
        .expect("parses");
        assert_eq!(xml.find("Code").map(|c| c.text.as_str()), Some("Throttling"));
        assert!(Xml::parse("not xml").is_err());
    }
}
