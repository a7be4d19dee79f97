-- A deal's own waiting page: the operator's HTML with placeholders the page's script fills
-- (checked when the deal is created; bounded as `PAGE_TEMPLATE_BYTES_MAX`).
ALTER TABLE deals
    ADD COLUMN wr_page_template TEXT CHECK (octet_length(wr_page_template) <= 12288);
